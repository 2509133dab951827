"""The ranking's momentum term: a video's trending level over its lifetime count."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.schemas import RecommendRequest
from app.scoring.ranking import LIFETIME_WEIGHTS, momentum
from feature_store.errors import StoreUnavailable
from feature_store.features.dense import STAT_FIELDS
from tests.app.conftest import service_of
from tests.app.test_api import put_videos, video_json, with_model
from tests.factories import make_event

HOUR_MS = 3_600_000


def _stats(**counts: float) -> np.ndarray:
    row = np.zeros(len(STAT_FIELDS))
    for name, value in counts.items():
        row[STAT_FIELDS.index(name)] = value
    return row


def test_momentum_is_the_recent_share_of_a_videos_engagement() -> None:
    """Near 0 when the engagement is recent, very negative when it is old; never above 0,
    even when a level is read a moment ahead of its counters."""
    stats = np.stack([_stats(plays=10), _stats(plays=10), _stats(finishes=1), _stats()])
    assert stats[2] @ LIFETIME_WEIGHTS == 2.0  # a finish counts as trending counts it
    levels = np.array([10.0, 10.0 * 2.0 ** -10, 5.0, 0.0])
    got = momentum(levels, stats)
    np.testing.assert_allclose(got, [0.0, np.log1p(10 * 2.0 ** -10) - np.log1p(10), 0.0, 0.0])


def _record(service: Any, video: str, ts: int, plays: int) -> None:
    events = [make_event(video_id=video, user_id=f"{video}-u{i}", event_id=f"{video}-{i}", ts=ts)
              for i in range(plays)]
    service.recommender.retriever.signals.record(events)
    service.resources.activity.record(events)


def _explained(service: Any, ids: list[str]) -> dict[str, Any]:
    request = RecommendRequest(user_id="someone", candidates=ids, count=len(ids), explain=True)
    response = service.recommender.recommend(request)
    assert not response.degraded
    return {item.video_id: item.explanation for item in response.items}


def test_a_faded_video_gets_a_lower_term_than_a_rising_one(client: TestClient) -> None:
    """Ten plays each: ten trending half-lives ago (1 h each by default) for one, a second
    ago for the other. The faded one's term is 0.75 * log((10 / 2**10 + 1) / 11)."""
    put_videos(client, [video_json(video_id=v, creator_id="c", category="k")
                        for v in ("faded", "rising")])
    with_model(client)
    service = service_of(client)
    now = int(time.time() * 1000)
    _record(service, "faded", now - 10 * HOUR_MS, 10)
    _record(service, "rising", now - 1000, 10)
    why = _explained(service, ["faded", "rising"])
    assert why["rising"].momentum_bonus == pytest.approx(0.0, abs=1e-3)
    assert why["faded"].momentum_bonus == pytest.approx(
        0.75 * (np.log1p(10 * 2.0 ** -10) - np.log1p(10)), rel=1e-3)


def test_unreadable_trending_leaves_the_term_out(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers degrade rather than fail: without trending the ranking goes on with the
    other terms, not from the popular list."""
    put_videos(client, [video_json(video_id=v) for v in ("a", "b")])
    with_model(client)
    service = service_of(client)
    _record(service, "a", int(time.time() * 1000) - 10 * HOUR_MS, 3)

    def down(*_: Any) -> list[float]:
        raise StoreUnavailable("signals trend_levels failed: down")

    monkeypatch.setattr(service.recommender.retriever.signals, "trend_levels", down)
    why = _explained(service, ["a", "b"])
    assert {w.momentum_bonus for w in why.values()} == {0.0}
