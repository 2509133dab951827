"""The cold start's anonymous scores, reused for a short while (app/scoring/reference_cache.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from app.candidates.retrieval import CandidateFilter
from app.schemas import RecommendRequest
from app.scoring.reference_cache import KEYS, ReferenceCache
from feature_store.events import EventContext
from tests.app.conftest import service_of
from tests.app.test_api import put_videos, video_json, with_model


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(rows: int = 16) -> Any:
    """What the cache reads of a video table: its id-to-row dict and its capacity."""
    return SimpleNamespace(row_of={}, hidden=np.zeros(rows, dtype=np.bool_))


def test_a_score_is_reused_for_its_ttl_and_only_under_its_own_key() -> None:
    clock, videos = Clock(), table()
    cache = ReferenceCache(0.5, clock)
    rows = np.array([3, 7])
    cache.put(videos, "v1", rows, np.array([0.25, 0.75], dtype=np.float32))

    scores, kept = cache.get(videos, "v1", np.array([7, 3, 5]))
    assert kept.tolist() == [True, True, False] and scores[:2].tolist() == [0.75, 0.25]
    assert not cache.get(videos, "v2", rows)[1].any()  # another model, fusion or context

    clock.now += 0.6
    assert not cache.get(videos, "v1", rows)[1].any()


def test_an_emptied_or_grown_table_and_a_zero_ttl() -> None:
    videos, cache = table(4), ReferenceCache(10.0, Clock())
    cache.put(videos, "k", np.array([1]), np.array([0.5], dtype=np.float32))
    videos.hidden = np.zeros(64, dtype=np.bool_)  # grown: old rows keep their scores
    assert cache.get(videos, "k", np.array([1, 40]))[1].tolist() == [True, False]
    cache.put(videos, "k", np.array([40]), np.array([0.1], dtype=np.float32))
    assert cache.get(videos, "k", np.array([40]))[1].all()

    videos.row_of = {}  # emptied: the rows now hold other videos
    assert not cache.get(videos, "k", np.array([1, 40]))[1].any()

    off = ReferenceCache(0.0, Clock())
    off.put(videos, "k", np.array([1]), np.array([0.5], dtype=np.float32))
    assert not off.get(videos, "k", np.array([1]))[1].any()


def test_the_least_recently_used_key_goes_first() -> None:
    videos, cache = table(), ReferenceCache(10.0, Clock())
    one = np.array([0])
    for key in range(KEYS):
        cache.put(videos, key, one, np.array([key], dtype=np.float32))
    cache.get(videos, 0, one)  # used: now the newest
    cache.put(videos, "new", one, np.array([1.0], dtype=np.float32))
    assert cache.get(videos, 0, one)[1].all() and not cache.get(videos, 1, one)[1].any()


def test_a_request_scores_only_the_new_videos_without_a_fresh_reference(
    client: TestClient,
) -> None:
    """In the service: the second request's anonymous scores are the first's, and its ONNX
    run holds only the user's rows; a new context is scored afresh."""
    put_videos(client, [video_json(video_id=f"new{i}", creator_id=f"c{i}") for i in range(20)])
    with_model(client)
    service = service_of(client)
    scorer, model = service.scorer, service.model
    scorer.reference_ttl_s = 3600.0  # this thread's cache is made with it below
    ids = [f"new{i}" for i in range(20)]
    _, rows = scorer.select(ids, CandidateFilter(), 500)
    new = service.recommender.rerank.cold_start.new_positions(scorer.extractor.table, rows)
    assert len(new) == 20  # no impressions yet: every video is new

    ran: list[int] = []
    original = scorer.run

    def run(model: Any, batch: Any, *rest: Any) -> Any:
        ran.append(batch.batch_size)
        return original(model, batch, *rest)

    scorer.run = run  # type: ignore[method-assign]
    phone = EventContext(device="phone")
    now = 1_800_000_000_000
    first = scorer.score_rows(model, "u1", now, phone, [], rows, anonymous_positions=new)
    second = scorer.score_rows(model, "u2", now, phone, [], rows, anonymous_positions=new)
    assert first.anonymous is not None and second.anonymous is not None
    np.testing.assert_array_equal(first.anonymous, second.anonymous)
    assert ran == [40, 20]
    # The rerank's separate path reads the same scores.
    np.testing.assert_array_equal(scorer.anonymous_scores(model, now, phone, rows), first.anonymous)
    assert ran == [40, 20]

    tv = EventContext(device="tv")
    scorer.score_rows(model, "u1", now, tv, [], rows, anonymous_positions=new)
    assert ran == [40, 20, 40]
    fresh = scorer.anonymous_scores(model, now, phone, rows)  # unchanged by the other key
    np.testing.assert_array_equal(fresh, first.anonymous)


def test_a_user_without_history_is_their_own_reference(client: TestClient) -> None:
    """Kept anonymous scores may be a moment old; a user with no events must still score
    the prior exactly (model lift 0), not the drift of others' training since then."""
    put_videos(client, [video_json(video_id=f"new{i}", creator_id=f"c{i}") for i in range(12)])
    with_model(client)
    service = service_of(client)
    scorer = service.scorer
    scorer.reference_ttl_s = 3600.0
    ids = [f"new{i}" for i in range(12)]
    _, rows = scorer.select(ids, CandidateFilter(), 500)
    key = (service.model.version, scorer.fusion, EventContext())
    scorer.references.put(  # a stale reference, far from what the model scores now
        scorer.extractor.table, key, rows, np.full(len(rows), 0.999, dtype=np.float32)
    )
    request = RecommendRequest(user_id="nobody", candidates=ids, count=12, explain=True)
    items = service.recommender.recommend(request).items
    lifts = [item.explanation.rerank.lift for item in items]  # type: ignore[union-attr]
    assert len(lifts) == 12 and all(lift == 0.0 for lift in lifts), lifts
