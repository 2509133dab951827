"""The two-tower model in the service: loaded with its version, the embedding source, fusion."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.candidates.ann import VideoIndex
from app.scoring.ranking import COSINE_UNIT, fuse, ranking_bonus
from feature_store.activity.base import HistoryEntry
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features import FeatureExtractor, FeatureRow
from tests.app.conftest import KEY, publish_model, service_of, wait_for
from tests.factories import make_event

GROUPS = 4


def _videos() -> list[Video]:
    now = int(time.time() * 1000)
    return [
        Video(video_id=f"w{g}-{i}", creator_id=f"c{g}", category=f"cat{g}", tags=(f"t{g}",),
              duration_ms=60_000, uploaded_at=now - 3_600_000)
        for g in range(GROUPS)
        for i in range(10)
    ]


def _publish_with_towers(service: Any, videos: list[Video], steps: int = 30) -> tuple[str, Any]:
    """Train towers on the service's own tables (users g* choose category g), publish them."""
    import torch

    from feature_store.features.schema import default_schema
    from feature_store.models.retrieval_io import ARTIFACTS, MANIFEST_KEY, Towers
    from trainer.export import publish
    from trainer.labels import Sample
    from trainer.model import WideDeep
    from trainer.retrieval import RetrievalTrainer
    from trainer.retrieval_export import writer

    torch.manual_seed(0)
    settings = service.resources.settings
    schema = default_schema(settings.features)
    extractor = FeatureExtractor(schema)
    towers = Towers.from_settings(schema, settings.retrieval)
    retrieval = RetrievalTrainer(
        towers, extractor.layout, service.resources.tables,
        settings.retrieval.model_copy(update={"batch_size": 32}),
    )
    rng = np.random.default_rng(0)
    for _ in range(steps):
        rows, events = [], []
        for _ in range(32):
            g = int(rng.integers(GROUPS))
            video = videos[g * 10 + int(rng.integers(10))]
            event = make_event(user_id=f"g{g}-{int(rng.integers(5))}", video_id=video.video_id,
                               type="finish")
            events.append(event)
            rows.append(FeatureRow(event.user_id, video.video_id, event.ts, video, event.context))
        packed = extractor.values(rows).packed
        retrieval.add([Sample(e, 1.0, 1.0, e.context, packed[i], float("nan"))
                       for i, e in enumerate(events)])
        assert retrieval.step()
    version = publish(
        service.resources.registry, WideDeep(schema, hidden=(32, 16)), schema, family="main",
        training_position={}, metrics={}, activate=True, keep=20,
        extra={MANIFEST_KEY: towers.describe()},
        artifacts=(list(ARTIFACTS), writer(retrieval, videos)),
    )
    return version, retrieval


def _serving(client: TestClient, version: str) -> Any:
    service = service_of(client)
    model = wait_for(
        lambda: service.holder.current
        if service.holder.current and service.holder.current.version == version else None
    )
    return service, model


def test_export_and_load_give_the_torch_vectors(client: TestClient) -> None:
    service = service_of(client)
    videos = _videos()
    version, retrieval = _publish_with_towers(service, videos)
    service, model = _serving(client, version)
    assert model.retrieval is not None
    index = model.retrieval.index
    ids, vectors = index.items()
    assert sorted(ids) == sorted(v.video_id for v in videos)
    assert index.status()["version"] == version and index.status()["kind"] == "exact"
    history = (HistoryEntry(video_id="w1-3", watch_ratio=1.0, ts=1),)
    context = EventContext(device="tv", country="DE", surface="home")
    row = FeatureRow("g1-2", "", 1_700_000_000_000, None, context, history)
    extractor = FeatureExtractor(service.resources.schema)
    want_user = retrieval.user_vectors(extractor.extract([row]))[0]
    got_user = model.retrieval.user_vector(
        "g1-2", 1_700_000_000_000, context, history, service.scorer.row_reader(model)
    )
    np.testing.assert_allclose(got_user, want_user, rtol=1e-4, atol=1e-5)
    from trainer.retrieval_export import video_vectors

    want_ids, want = video_vectors(retrieval, videos)
    order = [want_ids.index(v) for v in ids]
    np.testing.assert_allclose(vectors, want[order], atol=1e-6)


def test_embedding_source_leads_and_never_serves_hidden(client: TestClient) -> None:
    service = service_of(client)
    videos = _videos()
    service.resources.catalog.upsert(videos)
    service.signals.index_videos(videos)
    version, _ = _publish_with_towers(service, videos)
    _serving(client, version)
    now = int(time.time() * 1000)
    service.resources.activity.record(
        [make_event(user_id="g2-1", video_id="w2-0", type="finish", ts=now - 5000)]
    )
    body = client.post("/v1/recommend", json={"user_id": "g2-1", "count": 10}).json()
    items = body["items"]
    assert body["fallback"] is False
    assert any(i["source"] == "embedding" for i in items)
    top = [i["video_id"] for i in items[:5]]
    assert sum(v.startswith("w2-") for v in top) >= 4, items  # the user's group, learnt
    assert "w2-0" not in {i["video_id"] for i in items}  # seen
    for video in top:
        assert client.post(f"/v1/videos/{video}/hide", headers=KEY).status_code == 200
    body = client.post("/v1/recommend", json={"user_id": "g2-1", "count": 40}).json()
    assert not set(top) & {i["video_id"] for i in body["items"]}


def test_a_version_without_towers_still_serves(client: TestClient) -> None:
    service = service_of(client)
    version = publish_model(service.resources.registry, service.resources.schema)
    service, model = _serving(client, version)
    assert model.retrieval is None
    service.resources.catalog.upsert(_videos())
    now = int(time.time() * 1000)
    service.resources.activity.record(
        [make_event(user_id="g0-1", video_id="w0-0", type="finish", ts=now - 5000)]
    )
    body = client.post("/v1/recommend", json={"user_id": "g0-1", "count": 10}).json()
    assert body["model_version"] == version and body["fallback"] is False
    assert body["items"] and all(i["source"] != "embedding" for i in body["items"])


def test_index_search_excludes_and_removes() -> None:
    vectors = np.eye(4, dtype=np.float32)
    index = VideoIndex.build(["a", "b", "c", "d"], vectors)
    query = np.array([0.9, 0.5, 0.1, 0.0], np.float32)
    assert index.search(query, 2)[0] == ["a", "b"]
    assert index.search(query, 2, exclude={"a"})[0] == ["b", "c"]
    index.remove(["b"])
    assert index.search(query, 3)[0] == ["a", "c", "d"]
    assert index.size == 3


def test_fuse_adds_affinity_and_covisits_to_log_p() -> None:
    p = np.array([0.5, 0.5, 0.2], np.float32)
    affinity = np.array([0.9, 0.1, 0.9], np.float32)
    cosines = np.array([0.0, 0.0, 0.3])
    fused = fuse(p, ranking_bonus(3, affinity, cosines, 0.5, 1.0))
    np.testing.assert_allclose(
        fused, np.log(p) + 0.5 * (affinity - 0.9) + np.log1p(cosines / COSINE_UNIT), rtol=1e-6
    )
    assert list(np.argsort(-fused)) == [2, 0, 1]
    np.testing.assert_allclose(
        fuse(p, ranking_bonus(3, None, None, 0.5, 1.0)), np.log(p), rtol=1e-6
    )


@pytest.mark.parametrize("weight", [0.0])
def test_zero_weights_rank_by_the_model(weight: float) -> None:
    p = np.array([0.1, 0.3, 0.2], np.float32)
    bonus = ranking_bonus(3, np.array([1.0, -1.0, 0.0]), np.array([9.0, 0.0, 0.0]), weight, weight)
    fused = fuse(p, bonus)
    assert list(np.argsort(-fused)) == [1, 2, 0]


def test_status_and_dashboard_tell_the_index_age_and_a_hide_leaves_it(
    client: TestClient,
) -> None:
    from app.candidates.ann_rebuild import LiveIndex

    service = service_of(client)
    videos = _videos()
    service.resources.catalog.upsert(videos)
    version, _ = _publish_with_towers(service, videos)
    _, model = _serving(client, version)
    index = client.get("/v1/status", headers=KEY).json()["retrieval"]["index"]
    assert (index["kind"], index["size"], index["version"]) == ("exact", 40, version)
    assert 0 <= index["age_s"] < 600 and index["built_at"] <= time.time()
    board = client.get("/dashboard/api/overview", headers=KEY).json()["serving"]["index"]
    assert (board["kind"], board["size"]) == ("exact", 40)

    assert client.post("/v1/videos/w1-1/hide", headers=KEY).status_code == 200
    assert "w1-1" not in model.retrieval.index.items()[0]
    assert client.get("/v1/status", headers=KEY).json()["retrieval"]["index"]["size"] == 39
    query = model.retrieval.index.vectors_of(["w1-1"])
    assert not query[1].any(), "a hidden video has no vector to score either"

    # A restart restores this version's index from the data directory, without a build.
    saved = service.resources.settings.data_dir / "ann" / "main"
    restarted = LiveIndex(service.resources.settings.ann, directory=saved)
    assert restarted.status()["version"] == version and restarted.builds == 0
    ids, vectors = model.retrieval.index.items()
    assert not restarted.publish(ids, vectors, version=version), "same version: no rebuild"


def test_history_query_searches_with_the_recent_watches_vectors() -> None:
    """``retrieval.query: history`` (item-to-item): the mean of the watched videos' vectors."""
    from app.candidates.ann_rebuild import LiveIndex
    from app.scoring.retrieval import RetrievalModel
    from feature_store.features.schema import default_schema
    from feature_store.models.retrieval_io import Towers
    from feature_store.settings import AnnSettings, RetrievalSettings

    towers = Towers.from_settings(default_schema(), RetrievalSettings(dim=2))
    vectors = np.array([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], np.float32)
    index = LiveIndex(AnnSettings())
    index.publish(["a", "b", "c", "d"], vectors, version="v1", wait=True)
    model = RetrievalModel("v1", towers, None, index, query="history")  # type: ignore[arg-type]
    history = [HistoryEntry(video_id=v, watch_ratio=1.0, ts=1) for v in ("a", "ghost", "d", "c")]
    query = model.query_vector("u", 0, EventContext(), history, lambda t, k: k, window=2)
    assert query is not None
    np.testing.assert_allclose(query, [1.0, 0.0], atol=1e-6)  # a only: window 2, ghost has none
    assert model.neighbours(query, 2, exclude={"a"}) == ["b", "c"]
    query = model.query_vector("u", 0, EventContext(), history, lambda t, k: k, window=4)
    np.testing.assert_allclose(query, [0.0, 1.0], atol=1e-6)  # a and d cancel, c remains
    unknown = [HistoryEntry(video_id="ghost", watch_ratio=1.0, ts=1)]
    assert model.query_vector("u", 0, EventContext(), unknown, lambda t, k: k, window=2) is None
