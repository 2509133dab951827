"""The two-tower model: it learns a planted structure, checkpoints, and exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from feature_store.catalog.base import Video
from feature_store.errors import ConfigurationError
from feature_store.events import EventType
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import default_schema
from feature_store.models import sequence_io
from feature_store.models.retrieval_io import Towers, pool, tower_table
from feature_store.runtime.resources import table_specs
from feature_store.settings import RetrievalSettings, Settings
from feature_store.sparse import open_table
from tests.factories import BASE_TS, make_event
from trainer.labels import Sample
from trainer.retrieval import FrequencyEstimate, RetrievalTrainer
from trainer.retrieval_export import VideoInputs, video_vectors

SCHEMA = default_schema()
GROUPS = 8
USERS = 160
VIDEOS_PER_GROUP = 30


def _videos() -> list[Video]:
    return [
        Video(
            video_id=f"v{g}-{i}",
            creator_id=f"c{g}-{i % 3}",
            category=f"cat{g}",
            tags=(f"t{g}",),
            duration_ms=60_000,
            uploaded_at=BASE_TS,
        )
        for g in range(GROUPS)
        for i in range(VIDEOS_PER_GROUP)
    ]


def _retrieval(tmp_path: Path, **overrides: object) -> RetrievalTrainer:
    settings = Settings(data_dir=tmp_path, retrieval=RetrievalSettings(**overrides))  # type: ignore[arg-type]
    towers = Towers.from_settings(SCHEMA, settings.retrieval)
    tables = {
        spec.name: open_table(spec, settings)
        for spec in table_specs(SCHEMA, settings)
        if spec.name.startswith("tt_")
    }
    layout = FeatureExtractor(SCHEMA).layout
    return RetrievalTrainer(towers, layout, tables, settings.retrieval)


def _samples(rng: np.random.Generator, videos: list[Video], count: int) -> list[Sample]:
    """Users of group g (user index % GROUPS) choose videos of category g."""
    extractor = FeatureExtractor(SCHEMA)
    by_group = [[v for v in videos if v.category == f"cat{g}"] for g in range(GROUPS)]
    rows: list[FeatureRow] = []
    events = []
    for _ in range(count):
        u = int(rng.integers(USERS))
        video = by_group[u % GROUPS][int(rng.integers(VIDEOS_PER_GROUP))]
        event = make_event(user_id=f"u{u}", video_id=video.video_id, type="finish")
        events.append(event)
        rows.append(FeatureRow(user_id=event.user_id, video_id=video.video_id, ts_ms=event.ts,
                               video=video, context=event.context))
    packed = extractor.values(rows).packed
    return [
        Sample(e, 1.0, 1.0, e.context, packed[i], float("nan")) for i, e in enumerate(events)
    ]


def _user_vectors(retrieval: RetrievalTrainer, users: list[int]) -> np.ndarray:
    extractor = FeatureExtractor(SCHEMA)
    rows = [FeatureRow(user_id=f"u{u}", video_id="x", ts_ms=BASE_TS) for u in users]
    return retrieval.user_vectors(extractor.extract(rows))


def test_towers_learn_a_planted_structure(tmp_path: Path) -> None:
    """Top-20 of the user vector over all 240 videos: mostly the user's category (chance 1/8)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    videos = _videos()
    retrieval = _retrieval(tmp_path, batch_size=64)
    for _ in range(60):
        assert retrieval.add(_samples(rng, videos, 64)) == 64
        assert retrieval.step()
    assert retrieval.status()["steps"] == 60
    assert retrieval.status()["accuracy"] > 1 / 64 * 3
    ids, vectors = video_vectors(retrieval, videos)
    users = list(range(USERS))
    scores = _user_vectors(retrieval, users) @ vectors.T
    top = np.argsort(-scores, axis=1)[:, :20]
    hits = np.mean([
        np.mean([ids[j].startswith(f"v{u % GROUPS}-") for j in row])
        for u, row in zip(users, top, strict=True)
    ])
    assert hits > 0.6, hits  # chance: 0.125


def test_kept_video_inputs_give_the_fresh_vectors(tmp_path: Path) -> None:
    """Exports keep the videos' features, never their vectors: after training and a
    catalog change (a video edited, one hidden, one removed, one added, the rest read
    back as new objects, as from Redis), the vectors are a fresh export's, bit for bit."""
    torch.manual_seed(1)
    rng = np.random.default_rng(3)
    videos = _videos()
    retrieval = _retrieval(tmp_path, batch_size=32)
    inputs = VideoInputs(retrieval.towers.video)
    ids, first = video_vectors(retrieval, videos, inputs)
    fresh_ids, fresh = video_vectors(retrieval, videos)
    assert ids == fresh_ids and inputs.extracted == len(videos)
    np.testing.assert_array_equal(first, fresh)

    for _ in range(5):  # the weights move between exports
        retrieval.add(_samples(rng, videos, 32))
        assert retrieval.step()
    edited = videos[0].model_copy(update={"category": "cat7", "title": "now another"})
    hidden = videos[1].model_copy(update={"hidden": True})
    added = videos[5].model_copy(update={"video_id": "new-1", "tags": ("t3",)})
    changed = [edited, hidden, *(v.model_copy() for v in reversed(videos[3:])), added]
    ids, second = video_vectors(retrieval, changed, inputs)
    fresh_ids, fresh = video_vectors(retrieval, changed)
    assert ids == fresh_ids == [v.video_id for v in changed if not v.hidden]
    np.testing.assert_array_equal(second, fresh)
    assert inputs.extracted == len(videos) + 2  # only the edited and the added video
    kept = ids.index(videos[10].video_id)
    assert not np.allclose(second[kept], first[10])  # the current weights, not old vectors

    back = [*changed, videos[1], videos[2]]  # unhidden and restored: featurised again
    ids, third = video_vectors(retrieval, back, inputs)
    fresh_ids, fresh = video_vectors(retrieval, back)
    assert ids == fresh_ids
    np.testing.assert_array_equal(third, fresh)
    assert inputs.extracted == len(videos) + 4
    with pytest.raises(ValueError, match="other video columns"):
        video_vectors(retrieval, back, VideoInputs(retrieval.towers.user))


def test_only_chosen_positives_are_trained(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    retrieval = _retrieval(tmp_path, batch_size=4)
    samples = _samples(rng, _videos(), 6)
    skip = samples[0]._replace(event=make_event(type=EventType.SKIP.value))
    negative = samples[1]._replace(label=0.0)
    assert retrieval.add([skip, negative, *samples[2:]]) == 4
    assert retrieval.step()
    assert not retrieval.step()  # nothing buffered


def test_a_failed_step_is_skipped_and_counted(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    retrieval = _retrieval(tmp_path, batch_size=4)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("backend down")

    retrieval.tables[tower_table("video")].pull = broken  # type: ignore[method-assign]
    retrieval.add(_samples(rng, _videos(), 4))
    assert not retrieval.step()
    assert retrieval.status()["failed_steps"] == 1
    assert retrieval.status()["pending"] == 0


def test_checkpoint_restores_the_towers(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    videos = _videos()
    retrieval = _retrieval(tmp_path, batch_size=16)
    for _ in range(5):
        retrieval.add(_samples(rng, videos, 16))
        retrieval.step()
    retrieval.add(_samples(rng, videos, 5))  # buffered, not trained yet
    retrieval.save(tmp_path)
    restored = _retrieval(tmp_path, batch_size=16)
    assert restored.restore(tmp_path)
    for name, tensor in retrieval.model.state_dict().items():
        assert torch.equal(tensor, restored.model.state_dict()[name]), name
    np.testing.assert_array_equal(retrieval.frequency.gap, restored.frequency.gap)
    assert restored.frequency.step == retrieval.frequency.step == 5
    assert restored.status()["pending"] == 5
    assert restored.status()["steps"] == 5


def test_numpy_pooling_matches_the_towers(tmp_path: Path) -> None:
    """The service pools in numpy (retrieval_io.pool); the trainer in torch."""
    rng = np.random.default_rng(4)
    retrieval = _retrieval(tmp_path, batch_size=8)
    retrieval.add(_samples(rng, _videos(), 8))
    retrieval.step()
    extractor = FeatureExtractor(SCHEMA)
    history = tuple(make_history(["v1-1", "v2-2", "v3-3"]))
    rows = [FeatureRow(user_id="u3", video_id="x", ts_ms=BASE_TS, history=history)]
    batch = extractor.extract(rows)
    pulled = dict(zip(retrieval.model.tables, retrieval.pull(batch, train=False), strict=True))
    pooled = pool(retrieval.towers.user, batch, pulled)
    expected = retrieval.user_vectors(batch)
    with torch.no_grad():
        got = retrieval.model.user(torch.from_numpy(pooled)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def make_history(ids: list[str]) -> list[object]:
    from feature_store.activity.base import HistoryEntry

    return [HistoryEntry(video_id=v, watch_ratio=1.0, ts=BASE_TS) for v in ids]


def test_frequency_estimate_follows_the_gaps() -> None:
    estimate = FrequencyEstimate(1024, alpha=0.5)
    often, rare = np.array([7], np.uint64), np.array([9], np.uint64)
    for step in range(40):
        keys = np.concatenate([often, rare]) if step % 8 == 0 else often
        estimate.update(keys)
    assert estimate.log_probability(often)[0] == pytest.approx(0.0, abs=0.05)
    assert estimate.log_probability(rare)[0] == pytest.approx(-np.log(8), abs=0.2)


def test_unknown_tower_columns_name_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="retrieval.user_columns"):
        Towers.from_settings(SCHEMA, RetrievalSettings(user_columns=("nope",)))


@pytest.mark.slow
@pytest.mark.parametrize("sparse", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_loop_trains_exports_and_restores_the_towers(
    sparse: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from feature_store.models.registry import ModelRegistry
    from feature_store.models.retrieval_io import ARTIFACTS, MANIFEST_KEY, VIDEO_IDS_FILE
    from feature_store.runtime.resources import open_resources
    from feature_store.sim.world import SyntheticWorld
    from tests.trainer.helpers import WORLD, seed, trainer_settings, wait_until
    from trainer.component import TrainerComponent
    from trainer.loop import OnlineTrainer

    redis_url = request.getfixturevalue("redis_url") if sparse == "redis" else None
    settings = trainer_settings(tmp_path, sparse, redis_url)
    # The sequence tower refits in its worker process once 200 views arrived.
    settings = settings.model_copy(update={"sequence": settings.sequence.model_copy(
        update={"min_refit": 200})})
    world = SyntheticWorld(WORLD)
    events = world.events(8_000)
    with open_resources(settings) as resources:
        seed(resources, world, events)
        trainer = TrainerComponent(resources)
        trainer.start()
        wait_until(lambda: trainer.status()["events_total"] >= len(events), 120, "the stream")
        wait_until(lambda: trainer.loop.status()["sequence"]["fits"] >= 1, 120, "a refit")
        version = trainer.export_now(activate=True)
        trainer.stop()
        status = trainer.loop.status()["retrieval"]
        sequence = trainer.loop.status()["sequence"]
        state = {k: v.clone() for k, v in trainer.loop.retrieval.model.state_dict().items()}
        gap = trainer.loop.retrieval.frequency.gap.copy()
    assert status["steps"] > 0 and status["failed_steps"] == 0, status
    assert sequence["views"] > 0 and sequence["fits"] >= 1 and sequence["failed_refits"] == 0
    registry = ModelRegistry(tmp_path / "registry")
    manifest = registry.manifest(version)
    assert manifest.artifacts == [*ARTIFACTS, *sequence_io.ARTIFACTS]
    assert manifest.extra[MANIFEST_KEY]["dim"] == 32
    assert manifest.extra[sequence_io.MANIFEST_KEY]["fits"] >= 1  # the sequence tower too
    ids = (registry.artifact_path(version, VIDEO_IDS_FILE) or Path()).read_text().split()
    assert len(ids) == len([v for v in world.videos() if not v.hidden])

    with open_resources(settings) as resources:  # a restarted process: the same towers
        restored = OnlineTrainer(resources)
        restored.restore()
        assert restored.retrieval is not None
        for name, tensor in restored.retrieval.model.state_dict().items():
            assert torch.equal(tensor, state[name]), name
        np.testing.assert_array_equal(restored.retrieval.frequency.gap, gap)
        assert restored.stages.sequence is not None
        assert restored.stages.sequence.trainer.published is not None


def test_disabled_retrieval_has_no_tower_tables(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, retrieval=RetrievalSettings(enabled=False))
    assert not [s for s in table_specs(SCHEMA, settings) if s.name.startswith("tt_")]
