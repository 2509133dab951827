"""Loading, warming and hot-swapping exported models; the request feature extractor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.scoring.features import RequestFeatureExtractor
from app.scoring.onnx_model import ModelHolder, ModelLoadError, load_model
from app.scoring.scorer import Scorer
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.events import EventContext
from feature_store.features import FeatureExtractor, FeatureRow, default_schema
from feature_store.features.schema import RECENT_VIEWS
from feature_store.models.registry import MANIFEST_FILE, MODEL_FILE, ModelRegistry
from feature_store.settings import ApiSettings
from tests.app.conftest import KEY, publish_model, service_of, wait_for
from tests.factories import make_video
from tests.feature_checks import assert_same_features

SCHEMA = default_schema()
API = ApiSettings(batch_buckets=(16, 512), model_poll_interval_s=0.05)


def zero_tables() -> dict[str, object]:
    class Zeros:
        def __init__(self, dim: int) -> None:
            self.dim = dim

        def pull(self, keys: np.ndarray, *, train: bool = False) -> np.ndarray:
            return np.zeros((len(keys), self.dim), dtype=np.float32)

    dims = {**SCHEMA.table_dims(), "wide": 1}
    return {name: Zeros(dim) for name, dim in dims.items()}


@pytest.mark.parametrize("history_len", [0, 3, 40])
def test_request_features_equal_the_generic_extractor(history_len: int) -> None:
    videos = [
        make_video(
            video_id=f"x{i}",
            creator_id=f"c{i % 4}",
            tags=tuple(f"t{j}" for j in range(i % 11)),
            duration_ms=1000 + 997 * i,
        )
        for i in range(37)
    ]
    history = [HistoryEntry(video_id=f"x{i}", watch_ratio=0.4, ts=1) for i in range(history_len)]
    stats = [
        VideoStats(
            plays=i,
            impressions=3 * i,
            likes=i % 2,
            skips=i % 5,
            finishes=i % 3,
            last_ts=0 if i % 4 == 0 else 1_700_000_000_000 + i,
        )
        for i in range(37)
    ]
    context = EventContext(device="tv", country="DE", surface="home", position=33)
    ts = 1_700_000_900_000
    model_history = tuple(history[: SCHEMA.history_len])  # what the trainer's moments hold
    rows = [
        FeatureRow("u9", v.video_id, ts, v, context, model_history, s)
        for v, s in zip(videos, stats, strict=True)
    ]
    want = FeatureExtractor(SCHEMA).extract(rows)
    extractor = RequestFeatureExtractor(SCHEMA)
    for _ in range(2):  # the second pass reads the per-video key cache
        got = extractor.extract_request("u9", ts, context, history, videos, stats)
        assert_same_features(got, want, SCHEMA)
        # Deduplicated like training, per column (4 creators, the first 8 tags; the
        # history's entries carry no creator here: one more, missing, creator key)...
        creators = 4 + bool(history_len)
        assert len(np.unique(got.table_keys["creator"])) == len(want.table_keys["creator"])
        assert len(want.table_keys["creator"]) == creators
        assert len(got.table_keys["tags"]) == len(want.table_keys["tags"]) == 8
        # ... but video ids are not: a history video that is also a candidate is pulled twice.
        # (the history's videos twice, the pooled history and the attended sequence, and
        # the newest of them once more, the ``recent`` column)
        kept = min(history_len, SCHEMA.history_len)
        assert len(got.table_keys["video"]) == 37 + 2 * kept + min(kept, RECENT_VIEWS)
        assert len(got.wide_keys) == len(want.wide_keys)


def test_padding_to_a_bucket_does_not_change_scores(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    version = publish_model(registry, SCHEMA, seed=3)
    scorer = Scorer(SCHEMA, zero_tables())  # type: ignore[arg-type]
    model = load_model(registry, version, SCHEMA, "main", API, scorer.warm)
    assert model.provider == "CPUExecutionProvider"
    videos = [make_video(video_id=f"p{i}", category=f"k{i % 3}") for i in range(20)]
    stats = [VideoStats(plays=i) for i in range(20)]
    args = ("u1", 1_700_000_000_000, EventContext(), [], videos, stats)
    padded = scorer.score(model, *args)  # 20 rows padded to 512
    batch = scorer.features(*args)
    rows, wide = scorer.pull(batch)
    from feature_store.models import model_io

    exact = model.run(model_io.build_feed(SCHEMA, batch, rows, wide))
    np.testing.assert_allclose(padded, exact, rtol=1e-5)
    assert len(set(np.round(padded, 6).tolist())) > 1  # the videos' features matter


def keyed_tables() -> dict[str, object]:
    """Tables whose row of a key is a fixed function of the key (no two keys alike), so
    that a row read through a wrong index changes the score."""

    class Keyed:
        def __init__(self, dim: int) -> None:
            self.dim = dim

        def pull(self, keys: np.ndarray, *, train: bool = False) -> np.ndarray:
            phase = (keys % np.uint64(100_003)).astype(np.float64)[:, None]
            return np.sin(phase * np.arange(1, self.dim + 1)).astype(np.float32)

    dims = {**SCHEMA.table_dims(), "wide": 1}
    return {name: Keyed(dim) for name, dim in dims.items()}


@pytest.mark.parametrize("history_len", [0, 5])
def test_anonymous_rows_scored_in_the_users_run_score_as_in_their_own(
    tmp_path: Path, history_len: int
) -> None:
    registry = ModelRegistry(tmp_path)
    version = publish_model(registry, SCHEMA, seed=4)
    scorer = Scorer(SCHEMA, keyed_tables())  # type: ignore[arg-type]
    model = load_model(registry, version, SCHEMA, "main", API, scorer.warm)
    videos = [
        make_video(video_id=f"s{i}", creator_id=f"c{i % 5}", category=f"k{i % 3}",
                   tags=tuple(f"t{j}" for j in range(i % 4)))
        for i in range(40)
    ]
    history = [HistoryEntry(video_id=f"s{i}", watch_ratio=0.7, ts=1) for i in range(history_len)]
    ts, context = 1_700_000_000_000, EventContext(device="tv")
    rows = scorer.extractor.table.rows_of(videos)
    scorer.extractor.table.set_stats(rows, [VideoStats(plays=i) for i in range(40)])
    positions = np.array([1, 2, 3, 17, 39])

    together = scorer.score_rows(model, "u1", ts, context, history, rows,
                                 anonymous_positions=positions)
    alone = scorer.score_rows(model, "u1", ts, context, history, rows)
    reference = scorer.anonymous_scores(model, ts, context, rows[positions])

    np.testing.assert_allclose(together.scores, alone.scores, rtol=1e-5)
    assert together.anonymous is not None
    np.testing.assert_allclose(together.anonymous, reference, rtol=1e-5)
    assert not np.allclose(together.anonymous, together.scores[[1, 2, 3, 17, 39]])
    assert together.features is not None and together.features.batch_size == 40


def test_a_version_exported_with_the_history_per_row_still_scores_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions exported before the history was per sequence take it ``(B, L)``: the
    server feeds each row its sequence's indices, and the scores are the new form's."""
    import trainer.model
    from feature_store.models import model_io

    registry = ModelRegistry(tmp_path)
    current = publish_model(registry, SCHEMA, seed=5)
    with monkeypatch.context() as patch:
        def before(column: object) -> bool:
            return getattr(column, "pooling", None) == "attention"

        patch.setattr(model_io, "per_request", before)
        patch.setattr(trainer.model, "per_request", before)
        old = publish_model(registry, SCHEMA, seed=5)
    scorer = Scorer(SCHEMA, keyed_tables())  # type: ignore[arg-type]
    new_model = load_model(registry, current, SCHEMA, "main", API, scorer.warm)
    old_model = load_model(registry, old, SCHEMA, "main", API, scorer.warm)
    assert model_io.index_input("history") in old_model.row_shaped
    assert model_io.index_input("history") not in new_model.row_shaped
    videos = [make_video(video_id=f"h{i}", category=f"k{i % 3}") for i in range(30)]
    history = [HistoryEntry(video_id=f"h{i}", watch_ratio=0.9, ts=1) for i in range(7)]
    rows = scorer.extractor.table.rows_of(videos)
    args = ("u2", 1_700_000_000_000, EventContext(), history, rows)
    positions = np.array([0, 4, 9])
    want = scorer.score_rows(new_model, *args, anonymous_positions=positions)
    got = scorer.score_rows(old_model, *args, anonymous_positions=positions)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)
    assert got.anonymous is not None and want.anonymous is not None
    np.testing.assert_allclose(got.anonymous, want.anonymous, rtol=1e-5)


def test_schema_or_family_mismatch_is_refused(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    version = publish_model(registry, SCHEMA)
    scorer = Scorer(SCHEMA, zero_tables())  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="family"):
        load_model(registry, version, SCHEMA, "other", API, scorer.warm)
    manifest = registry.versions_dir / version / MANIFEST_FILE
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "schema_hash": "0" * 16}))
    with pytest.raises(ModelLoadError, match="schema_hash"):
        load_model(registry, version, SCHEMA, "main", API, scorer.warm)


def test_holder_swaps_and_keeps_old_on_broken_version(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    scorer = Scorer(SCHEMA, zero_tables())  # type: ignore[arg-type]
    failures: list[str] = []
    holder = ModelHolder(
        registry,
        lambda v: load_model(registry, v, SCHEMA, "main", API, scorer.warm),
        0.05,
        on_failure=lambda v, exc: failures.append(v),
    )
    assert holder.poll_once() is False and holder.current is None
    first = publish_model(registry, SCHEMA, seed=1)
    holder.start()
    try:
        assert holder.current is not None and holder.current.version == first
        old = holder.current
        second = publish_model(registry, SCHEMA, seed=2)
        wait_for(lambda: holder.current is not None and holder.current.version == second)
        # A request that took the old model before the swap still completes on it.
        videos = [make_video() for _ in range(3)]
        assert len(scorer.score(old, "u", 0, EventContext(), [], videos, [VideoStats()] * 3)) == 3
        broken = publish_model(registry, SCHEMA, seed=3, activate=False)
        (registry.versions_dir / broken / MODEL_FILE).write_bytes(b"not an onnx file")
        registry.activate(broken)
        wait_for(lambda: broken in holder.failed)
        assert holder.current.version == second
        assert failures == [broken]
        time.sleep(0.2)
        assert failures == [broken]  # not retried while the pointer stays
        registry.rollback()
        time.sleep(0.2)
        assert holder.current.version == second
    finally:
        holder.close()


def test_service_hot_swaps_over_http(client: TestClient) -> None:
    service = service_of(client)
    registry = service.resources.registry
    client.put(
        "/v1/videos",
        json={"videos": [json.loads(make_video(video_id="hs1").model_dump_json())]},
        headers=KEY,
    )
    first = publish_model(registry, SCHEMA, seed=1)
    wait_for(
        lambda: (
            client.post("/v1/recommend", json={"user_id": "a", "candidates": ["hs1"]}).json()[
                "model_version"
            ]
            == first
        )
    )
    second = publish_model(registry, SCHEMA, seed=2)
    got = wait_for(
        lambda: (
            (
                r := client.post(
                    "/v1/recommend", json={"user_id": "a", "candidates": ["hs1"]}
                ).json()
            )["model_version"]
            == second
            and r
        )
    )
    assert got["items"][0]["video_id"] == "hs1"
    metrics = client.get("/metrics").text
    assert "vidrec_model_swaps_total 2.0" in metrics


def test_request_features_follow_a_changed_catalog_record() -> None:
    extractor = RequestFeatureExtractor(SCHEMA)
    video = make_video(video_id="chg", category="news", tags=("a",))
    args = ("u1", 1_700_000_000_000, EventContext(), [])
    first = extractor.extract_request(*args, [video], [VideoStats()])
    same = extractor.extract_request(*args, [video.model_copy()], [VideoStats()])  # equal copy
    np.testing.assert_array_equal(same.table_keys["category"], first.table_keys["category"])
    changed = video.model_copy(update={"category": "sport", "tags": ("b", "c")})
    got = extractor.extract_request(*args, [changed], [VideoStats()])
    want = FeatureExtractor(SCHEMA).extract(
        [FeatureRow("u1", "chg", 1_700_000_000_000, changed, EventContext(), (), VideoStats())]
    )
    assert_same_features(got, want, SCHEMA)
    np.testing.assert_array_equal(got.table_keys["category"], want.table_keys["category"])
    np.testing.assert_array_equal(np.sort(got.table_keys["tags"]), want.table_keys["tags"])


def test_request_features_follow_changed_counters() -> None:
    """The per-video dense cache is refreshed when a video's counters object changes."""
    extractor = RequestFeatureExtractor(SCHEMA)
    videos = [make_video(video_id=f"s{i}") for i in range(5)]
    ts = 1_700_000_900_000
    args = ("u1", ts, EventContext(), [])
    for plays in (0, 7, 7, 40):
        stats = [VideoStats(plays=plays + i, finishes=i, last_ts=ts - 1000 * i) for i in range(5)]
        got = extractor.extract_request(*args, videos, stats)
        want = FeatureExtractor(SCHEMA).extract(
            [
                FeatureRow("u1", v.video_id, ts, v, EventContext(), (), s)
                for v, s in zip(videos, stats, strict=True)
            ]
        )
        np.testing.assert_allclose(got.dense, want.dense, rtol=1e-6)


def test_request_features_with_a_cross_of_two_video_columns_and_repeated_candidates() -> None:
    """The per-row fallback for a cross of two video columns; a candidate given twice."""
    from feature_store.features.columns import Crossed
    from feature_store.features.schema import FeatureSchema

    schema = FeatureSchema(
        columns=(*SCHEMA.columns, Crossed("creator_x_category", ("creator", "category")))
    )
    videos = [
        make_video(video_id=f"d{i}", creator_id=f"c{i % 3}", category=f"k{i % 2}") for i in range(8)
    ]
    videos.append(videos[0])  # the caller repeated a candidate
    stats = [VideoStats(plays=i) for i in range(9)]
    history = [HistoryEntry(video_id="d1", watch_ratio=1.0, ts=1)]
    ts = 1_700_000_900_000
    rows = [
        FeatureRow("u1", v.video_id, ts, v, EventContext(), tuple(history), s)
        for v, s in zip(videos, stats, strict=True)
    ]
    want = FeatureExtractor(schema).extract(rows)
    extractor = RequestFeatureExtractor(schema)
    got = extractor.extract_request("u1", ts, EventContext(), history, videos, stats)
    assert_same_features(got, want, schema)
    assert len(got.wide_keys) <= len(want.wide_keys) + 2 * 3  # video-id crosses: 1 repeat each


def test_provider_preference(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA is asked for only where it can work (or when forced)."""
    from app.scoring import onnx_model

    cuda, cpu = "CUDAExecutionProvider", "CPUExecutionProvider"
    monkeypatch.setattr(onnx_model.ort, "get_available_providers", lambda: [cuda, cpu])
    monkeypatch.setattr(onnx_model, "_cuda_usable", None)
    monkeypatch.setattr(onnx_model, "nvidia_driver_present", lambda: False)
    assert onnx_model.provider_preference("auto") == [cpu]  # no driver: no loud CUDA error
    assert onnx_model.provider_preference("cuda") == [cuda, cpu]
    assert onnx_model.provider_preference("cpu") == [cpu]
    monkeypatch.setattr(onnx_model, "nvidia_driver_present", lambda: True)
    assert onnx_model.provider_preference("auto") == [cuda, cpu]
    monkeypatch.setattr(onnx_model, "_cuda_usable", False)  # a CUDA session failed once
    assert onnx_model.provider_preference("auto") == [cpu]
    monkeypatch.setattr(onnx_model.ort, "get_available_providers", lambda: [cpu])
    assert onnx_model.provider_preference("cuda") == [cpu]


@pytest.mark.parametrize("user_attributes", [False, True])
def test_reference_rows_read_what_their_own_batch_reads(user_attributes: bool) -> None:
    """:meth:`extract_with_reference`'s rows point at the keys (and carry the dense values)
    of each user's own :meth:`extract_rows`: the user's for every candidate, then the
    anonymous reference's for the positions asked, sharing the videos' keys. Crosses of
    the user with a video column, of two video columns, and of context only included."""
    from feature_store.features.columns import Crossed
    from feature_store.features.schema import FeatureSchema
    from feature_store.settings import FeatureSettings
    from tests.feature_checks import resolved

    base = default_schema(FeatureSettings(user_attributes=user_attributes))
    schema = FeatureSchema(
        columns=(
            *base.columns,
            Crossed("creator_x_category", ("creator", "category")),
            Crossed("device_x_country", ("device", "country")),
        ),
        history_len=base.history_len,
    )
    videos = [
        make_video(video_id=f"r{i}", creator_id=f"c{i % 4}", category=f"k{i % 3}",
                   tags=tuple(f"t{j}" for j in range(i % 5)))
        for i in range(25)
    ]
    history = [HistoryEntry(video_id=f"r{i}", watch_ratio=0.8, ts=1) for i in range(6)]
    context = EventContext(device="tv", country="DE", surface="home", position=3,
                           age_group="25-34", gender="F")
    ts = 1_700_000_900_000
    extractor = RequestFeatureExtractor(schema)
    rows = extractor.table.rows_of(videos)
    extractor.table.set_stats(rows, [VideoStats(plays=i, impressions=2 * i) for i in range(25)])
    positions = np.array([0, 3, 4, 11, 24])
    both = extractor.extract_with_reference("u7", ts, context, history, rows, "~anon", positions)
    user = extractor.extract_rows("u7", ts, context, history, rows)
    reference = extractor.extract_rows("~anon", ts, context, (), rows[positions])
    assert both.batch_size == 30
    got = resolved(both, schema)
    for part, want_batch in ((slice(0, 25), user), (slice(25, 30), reference)):
        want = resolved(want_batch, schema)
        assert got.keys() == want.keys()
        for name, keys in want.items():
            np.testing.assert_array_equal(got[name][part], keys, err_msg=name)
        np.testing.assert_allclose(both.dense[part], want_batch.dense, rtol=1e-6)
    # The videos' keys are listed once: the reference adds its own keys only.
    assert len(both.table_keys["video"]) < len(user.table_keys["video"]) + 5
    head = both.first_rows(25)
    assert head.batch_size == 25
    for name, keys in resolved(user, schema).items():
        np.testing.assert_array_equal(resolved(head, schema)[name], keys, err_msg=name)


def test_score_rows_calls_meanwhile_once_with_rows_or_without(tmp_path: Path) -> None:
    """The recommender's learned terms ride in ``meanwhile``: called once, beside the run,
    or here when no candidate is left to run."""
    registry = ModelRegistry(tmp_path)
    version = publish_model(registry, SCHEMA, seed=4)
    scorer = Scorer(SCHEMA, keyed_tables())  # type: ignore[arg-type]
    model = load_model(registry, version, SCHEMA, "main", API, scorer.warm)
    rows = scorer.extractor.table.rows_of([make_video(video_id=f"m{i}") for i in range(5)])
    calls: list[int] = []
    ts, context = 1_700_000_000_000, EventContext()
    scorer.score_rows(model, "u1", ts, context, [], rows, meanwhile=lambda: calls.append(1))
    scorer.score_rows(model, "u1", ts, context, [], rows[:0], meanwhile=lambda: calls.append(2))
    assert calls == [1, 2]
