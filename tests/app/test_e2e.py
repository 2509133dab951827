"""End to end over HTTP with real Redis and the Kafka-protocol broker.

The service runs under uvicorn with the Redis sparse tables and stores, the
Kafka event log (Tansu) and the real trainer started by the composition root's
``embedded_trainer`` (as ``vidrec up`` does). A catalog and events go in over HTTP; the trainer
consumes them, exports a new version, the service hot-swaps it, and the
user's recommendations move toward what they just engaged with.
"""

from __future__ import annotations

import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

with warnings.catch_warnings():
    # kafka-python's import warns from importlib's frame, past the pyproject filter.
    warnings.simplefilter("ignore", DeprecationWarning)
    import feature_store.eventlog.kafka  # noqa: F401

from app.candidates.sources import PERSONAL
from app.main import create_app
from app.wiring import embedded_trainer
from tests.app.conftest import KEY, make_settings, serve_in_thread, wait_for
from tests.services import TansuBroker

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]

CATEGORIES = ("cars", "cats")
PER_CATEGORY = 30


def catalog(now: int) -> list[dict[str, Any]]:
    """Two categories to engage with, plus new uploads by the car creators, watched by nobody."""
    new = [
        {
            "video_id": f"newcar{i}",
            "creator_id": f"cars-creator{i}",
            "category": "cars",
            "tags": ["cars"],
            "duration_ms": 60_000,
            "uploaded_at": now - 60_000,
        }
        for i in range(3)
    ]
    return new + [
        {
            "video_id": f"{cat}{i}",
            "creator_id": f"{cat}-creator{i % 3}",
            "category": cat,
            "tags": [cat],
            "duration_ms": 60_000,
            "uploaded_at": now - 3_600_000 - 1000 * i,
        }
        for cat in CATEGORIES
        for i in range(PER_CATEGORY)
    ]


def engagement(
    user: str, liked: str, disliked: str, rounds: range, now: int
) -> list[dict[str, Any]]:
    """``user`` finishes and likes videos of ``liked`` and skips those of ``disliked``."""
    events: list[dict[str, Any]] = []
    ts = now - 600_000
    for r in rounds:
        for i in range(PER_CATEGORY):
            ts += 100
            base = {"user_id": user, "ts": ts, "context": {"device": "phone", "surface": "home"}}
            if (i + r) % 2 == 0:
                events.append(
                    {
                        **base,
                        "event_id": f"{user}-f{r}-{i}",
                        "video_id": f"{liked}{i}",
                        "type": "finish",
                        "watch_ms": 60_000,
                        "duration_ms": 60_000,
                    }
                )
            else:
                events.append(
                    {
                        **base,
                        "event_id": f"{user}-s{r}-{i}",
                        "video_id": f"{disliked}{i}",
                        "type": "skip",
                    }
                )
    return events


def share(items: list[dict[str, Any]], category: str, k: int = 10) -> float:
    top = items[:k]
    return sum(1 for item in top if item["video_id"].startswith(category)) / len(top)


def lead(items: list[dict[str, Any]], first: str, second: str) -> float:
    """How much higher ``first``'s videos score than ``second``'s on average."""
    def mean(category: str) -> float:
        scores = [i["score"] for i in items if i["video_id"].startswith(category)]
        return sum(scores) / max(1, len(scores))
    return mean(first) - mean(second)


def test_events_train_a_new_version_that_shifts_recommendations(
    tmp_path: Path, redis_url: str, kafka_broker: TansuBroker
) -> None:
    settings = make_settings(
        tmp_path,
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        event_log={"backend": "kafka", "topic_namespace": f"e2e{uuid.uuid4().hex[:8]}"},
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "partitions": 2},
        trainer={"export_every_s": 0, "max_wait_ms": 50, "batch_size": 256},
    )
    app = create_app(settings, trainer=embedded_trainer)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        now = int(time.time() * 1000)
        put = http.put("/v1/videos", json={"videos": catalog(now)}, headers=KEY)
        assert put.status_code == 200 and put.json()["accepted"] == 2 * PER_CATEGORY + 3
        trainer = app.state.service.trainer
        first = trainer.export_now(activate=True)
        wait_for(lambda: http.get("/readyz").json()["degraded"] is False, timeout_s=60)
        every = [f"{cat}{i}" for cat in CATEGORIES for i in range(PER_CATEGORY)]
        ask = {"user_id": "alice", "candidates": every, "count": 60, "exclude_seen": False}
        before = http.post("/v1/recommend", json=ask).json()
        assert before["model_version"] == first

        # The client reports what it showed, naming the response: the trainer joins
        # these impressions to the served log (Kafka topic beside the events).
        events = [
            {"event_id": f"shown-{k}", "user_id": "alice", "video_id": item["video_id"],
             "type": "impression", "ts": now - 700_000 + k,
             "recommendation_id": before["recommendation_id"]}
            for k, item in enumerate(before["items"][:10])
        ]
        events += engagement("alice", "cars", "cats", range(6), now)
        events += engagement("bob", "cats", "cars", range(6), now)
        posted = 0
        for start in range(0, len(events), 100):
            response = http.post(
                "/v1/events", json={"events": events[start : start + 100]}, headers=KEY
            )
            assert response.status_code == 200 and response.json()["rejected"] == 0
            posted += response.json()["accepted"]
        wait_for(lambda: trainer.status()["events_total"] >= posted, timeout_s=90)
        # Serving's own view of the users (the signal feed's), which their features read.
        history = app.state.service.resources.activity.history
        wait_for(lambda: history("alice") and history("bob"), timeout_s=90)
        assert trainer.status()["served"]["joined"] == 10
        second = trainer.export_now(activate=True)
        assert second != first
        after = wait_for(
            lambda: (
                (r := http.post("/v1/recommend", json=ask).json())["model_version"] == second and r
            ),
            timeout_s=30,
        )
        # The first version knew nothing of either category, so its top 10 is the order
        # of tied scores (once all cars by chance); the trained one prefers alice's.
        assert lead(after["items"], "cars", "cats") > lead(before["items"], "cars", "cats")
        assert share(after["items"], "cars") >= 0.8
        bob = http.post("/v1/recommend", json={**ask, "user_id": "bob"}).json()
        assert share(bob["items"], "cats") >= 0.8

        # Without candidates, retrieval follows alice too: what she watched is
        # excluded as seen, and the new uploads of her creators and category, found by
        # the sources that read her history, come first.
        own = http.post("/v1/recommend", json={"user_id": "alice", "count": 5}).json()
        assert own["fallback"] is False and own["model_version"] == second
        sources = {i["video_id"]: i["source"] for i in own["items"]}
        assert {"newcar0", "newcar1", "newcar2"} <= set(sources)
        assert {sources[f"newcar{i}"] for i in range(3)} <= PERSONAL
        assert not any(v.startswith("cars") for v in sources)  # all of them seen
        status = http.get("/v1/status").json()
        assert status["model"]["provider"] == "CPUExecutionProvider"
        assert status["trainer"]["state"] == "running"
