"""The served score as a weighted fusion of the ranking heads; old single-output models."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.scoring.fusion import ENGAGEMENT_ONLY, Fusion
from app.scoring.onnx_model import load_model
from app.scoring.scorer import Scorer
from feature_store.activity.base import VideoStats
from feature_store.events import EventContext
from feature_store.experiments import Arm
from feature_store.features import default_schema
from feature_store.models import model_io
from feature_store.models.registry import Manifest, ModelRegistry
from feature_store.settings import ApiSettings
from tests.app.conftest import KEY, publish_model, service_of, wait_for
from tests.app.test_model import zero_tables
from tests.factories import make_video

SCHEMA = default_schema()
API = ApiSettings(batch_buckets=(16, 512), model_poll_interval_s=0.05)

# Two candidates: A is more engaging but often skipped, B less engaging and rarely skipped.
HEADS = {
    "engagement": np.array([0.6, 0.4], dtype=np.float32),
    "watch": np.array([0.5, 0.5], dtype=np.float32),
    "negative": np.array([0.7, 0.05], dtype=np.float32),
}


def test_engagement_alone_is_the_score_before_heads() -> None:
    assert ENGAGEMENT_ONLY.identity
    np.testing.assert_array_equal(ENGAGEMENT_ONLY.fuse(HEADS), HEADS["engagement"])


def test_weights_change_the_order_as_configured() -> None:
    assert np.argmax(ENGAGEMENT_ONLY.fuse(HEADS)) == 0  # engagement alone: A first
    penalised = Fusion.of({"engagement": 1.0, "negative": -1.0}).fuse(HEADS)
    assert np.argmax(penalised) == 1  # a skip penalty puts B first
    np.testing.assert_allclose(penalised, [0.6 * 0.3, 0.4 * 0.95], rtol=1e-6)


def test_fused_score_is_in_0_1_and_monotone_in_each_head() -> None:
    rng = np.random.default_rng(0)
    fusion = Fusion.of({"engagement": 1.0, "watch": 0.5, "negative": -1.0})
    heads = {h: rng.uniform(0, 1, 1000).astype(np.float32) for h in model_io.HEADS}
    heads["negative"][:10] = 1.0  # certain skips: still above 0
    score = fusion.fuse(heads)
    assert (score > 0).all() and (score <= 1).all()
    for head, direction in (("engagement", 1), ("watch", 1), ("negative", -1)):
        moved = dict(heads)
        moved[head] = np.clip(heads[head] + 0.1, 0, 1).astype(np.float32)
        assert (direction * (fusion.fuse(moved) - score) >= -1e-7).all(), head
    strong = Fusion.of({"engagement": 100.0}).fuse({"engagement": np.array([1e-7], np.float32)})
    assert strong[0] > 0  # no underflow to 0


def test_weights_are_validated_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="ranking_weights.engagement"):
        ApiSettings(ranking_weights={"engagement": 0.0})
    with pytest.raises(ValueError, match="ranking_weights"):
        ApiSettings(ranking_weights={})
    with pytest.raises(ValueError, match="ranking_weights"):
        ApiSettings(ranking_weights={"clicks": 1.0})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="fusion"):
        Arm(name="a", family="main", fusion={"engagement": float("nan")})


def test_arm_without_fusion_is_written_without_the_key() -> None:
    """A book written here stays readable by a server from before the field."""
    assert "fusion" not in Arm(name="a", family="main").model_dump(mode="json")
    arm = Arm(name="b", family="main", fusion={"engagement": 1.0, "negative": -2.0})
    assert Arm.model_validate(arm.model_dump(mode="json")) == arm


def test_scorer_fuses_the_model_heads(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    version = publish_model(registry, SCHEMA, seed=3)
    weights = {"engagement": 1.0, "watch": 0.5, "negative": -1.0}
    scorer = Scorer(SCHEMA, zero_tables(), fusion=Fusion.of(weights))  # type: ignore[arg-type]
    model = load_model(registry, version, SCHEMA, "main", API, scorer.warm)
    assert model.heads == model_io.HEADS
    videos = [make_video(video_id=f"p{i}", category=f"k{i % 3}") for i in range(20)]
    args = ("u1", 1_700_000_000_000, EventContext(), [], videos, [VideoStats()] * 20)
    fused = scorer.score(model, *args)
    batch = scorer.features(*args)
    rows, wide = scorer.pull(batch)
    heads = model.run_heads(model_io.build_feed(SCHEMA, batch, rows, wide))
    np.testing.assert_allclose(fused, Fusion.of(weights).fuse(heads), rtol=1e-5)
    engagement = Scorer(SCHEMA, zero_tables()).score(model, *args)  # type: ignore[arg-type]
    np.testing.assert_allclose(engagement, heads["engagement"], rtol=1e-5)


def publish_single_output(registry: ModelRegistry, seed: int = 0) -> str:
    """A version as exported before heads: one output, ``score``."""
    import torch

    from trainer.export import OPSET, dynamic_axes, example_inputs
    from trainer.model import WideDeep

    torch.manual_seed(seed)
    model = WideDeep(SCHEMA, hidden=(32, 16)).eval()
    names = model_io.input_names(SCHEMA)
    axes = dynamic_axes(SCHEMA, [model_io.SCORE])
    example = example_inputs(SCHEMA, 4, np.random.default_rng(0), rows_per_table=6, wide_rows=9)

    def export(path: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, tuple(example), str(path), input_names=names,
                              output_names=[model_io.SCORE], dynamic_axes=axes,
                              opset_version=OPSET, dynamo=False)

    time.sleep(0.002)
    version = registry.new_version_name("main")
    registry.publish(export, Manifest(
        version=version, family="main", created_at_ms=int(time.time() * 1000),
        schema_hash=SCHEMA.schema_hash(), table_dims=dict(SCHEMA.table_dims()),
        training_position={}, metrics={}, opset=OPSET, extra={"exporter": "torchscript"},
    ))
    registry.activate(version)
    return version


def test_an_old_single_output_model_still_loads_and_serves(client: TestClient) -> None:
    service = service_of(client)
    registry = service.resources.registry
    videos = [make_video(video_id=f"old{i}", category=f"k{i % 3}") for i in range(5)]
    client.put(
        "/v1/videos",
        json={"videos": [json.loads(v.model_dump_json()) for v in videos]},
        headers=KEY,
    )
    old = publish_single_output(registry)
    body = {"user_id": "a", "candidates": [v.video_id for v in videos]}
    got = wait_for(
        lambda: (r := client.post("/v1/recommend", json=body).json())["model_version"] == old
        and r
    )
    assert service.holder.current.heads == ("engagement",)
    assert not got["fallback"] and len(got["items"]) == 5
    scores = [i["score"] for i in got["items"]]
    assert all(0 < s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    # Scored by engagement alone whatever the weights: the same as weights of engagement 1.
    model = service.holder.current
    alone = Scorer(SCHEMA, service.scorer.tables)
    want = alone.score(model, "a", 1_700_000_000_000, EventContext(), [], videos,
                       [VideoStats()] * 5)
    fused = service.scorer.score(model, "a", 1_700_000_000_000, EventContext(), [], videos,
                                 [VideoStats()] * 5)
    np.testing.assert_allclose(fused, want, rtol=1e-6)


def test_an_arm_with_its_own_weights_is_scored_with_them(tmp_path: Path) -> None:
    """Two arms on one family, differing only by their fusion weights."""
    from app.main import create_app
    from feature_store.experiments import ExperimentSpec, arm_index, salt_bytes, thresholds
    from tests.app.conftest import make_settings
    from tests.app.test_families import VIDEOS

    experiment = {
        "id": "fusion1",
        "arms": [{"name": "a", "family": "main"},
                 {"name": "b", "family": "main", "fusion": {"negative": -1.0}}],
    }
    settings = make_settings(tmp_path / "data", api={"ranking_weights": {"engagement": 1.0}})
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        service.resources.catalog.upsert(VIDEOS)
        live = publish_model(service.resources.registry, SCHEMA, seed=3)
        wait_for(lambda: service.model is not None and service.model.version == live)
        started = client.post("/dashboard/api/actions/experiment_start",
                              json={"experiment": experiment},
                              headers={**KEY, "X-Operator": "alice"}).json()
        assert started["status"] == "done", started
        wait_for(lambda: service.arms.describe() and all(
            a["version"] for a in service.arms.describe()["arms"].values()))
        spec = ExperimentSpec.model_validate(experiment)
        salt, bounds = salt_bytes(spec), thresholds(spec.arms)
        candidates = [v.video_id for v in VIDEOS]
        model = service.model
        service.recommender.clock = lambda: 1_700_000_000.0  # features as the test computes
        service.recommender.rerank = None  # the raw fused scores: no cold-start cap
        seen = set()
        for i in range(30):
            user = f"user{i}"
            answer = client.post("/v1/recommend", json={"user_id": user, "candidates": candidates,
                                                        "count": len(candidates)}).json()
            arm = "ab"[arm_index(salt, user, bounds)]
            assert answer["experiment"]["arm"] == arm
            weights = {"engagement": 1.0} if arm == "a" else {"negative": -1.0}
            scorer = Scorer(SCHEMA, service.scorer.tables, fusion=Fusion.of(weights))
            want = scorer.score(model, user, 1_700_000_000_000, EventContext(), [], VIDEOS,
                                [VideoStats()] * len(VIDEOS))
            by_id = dict(zip(candidates, want.tolist(), strict=True))
            for item in answer["items"]:
                assert item["score"] == pytest.approx(by_id[item["video_id"]], rel=1e-4), arm
            seen.add(arm)
        assert seen == {"a", "b"}


def test_a_head_that_never_trained_is_left_out_of_the_fusion(tmp_path: Path) -> None:
    """A log of finishes only never trains the watch head: its output is not used."""
    import torch

    from trainer.export import publish
    from trainer.model import WideDeep

    registry = ModelRegistry(tmp_path)
    torch.manual_seed(3)
    version = publish(
        registry, WideDeep(SCHEMA, hidden=(32, 16)), SCHEMA, family="main",
        training_position={}, metrics={}, activate=True, keep=5,
        extra={"head_samples": {"engagement": 5000, "watch": 0, "negative": 5000}},
    )
    weights = {"engagement": 1.0, "watch": 0.5, "negative": -1.0}
    scorer = Scorer(SCHEMA, zero_tables(), fusion=Fusion.of(weights))  # type: ignore[arg-type]
    model = load_model(registry, version, SCHEMA, "main", API, scorer.warm)
    assert model.heads == ("engagement", "negative")
    videos = [make_video(video_id=f"p{i}", category=f"k{i % 3}") for i in range(20)]
    args = ("u1", 1_700_000_000_000, EventContext(), [], videos, [VideoStats()] * 20)
    batch = scorer.features(*args)
    rows, wide = scorer.pull(batch)
    heads = model.run_heads(model_io.build_feed(SCHEMA, batch, rows, wide))
    assert set(heads) == {"engagement", "negative"}
    want = Fusion.of({"engagement": 1.0, "negative": -1.0}).fuse(heads)
    np.testing.assert_allclose(scorer.score(model, *args), want, rtol=1e-5)
    lenient = ApiSettings(batch_buckets=(16, 512), min_head_samples=0)
    assert load_model(registry, version, SCHEMA, "main", lenient, scorer.warm).heads == (
        model_io.HEADS
    )
