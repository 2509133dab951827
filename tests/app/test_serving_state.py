"""Serving's state of its own: the signal feed keeps histories and counters, no trainer needed.

The service runs alone (no trainer at all): a video the user just played is
excluded from their recommendations and shows in their history (what the
history features and ``exclude_seen`` read), and its counters move; the
trainer's own copy (``Resources.training_activity``) is left alone. On the
embedded backends and on Redis + the Kafka-protocol broker. The production
topology (a separate trainer paused, then stopped) is
``tests/production/test_serving_state.py``.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.signal_feed import SignalFeed, feed_group
from feature_store.errors import StoreUnavailable
from feature_store.events import Event
from feature_store.runtime.resources import open_resources
from feature_store.signals import serving_signals
from feature_store.signals.feedback import serving_feedback
from tests.app.conftest import KEY, make_settings, serve_in_thread, wait_for


def _catalog(now: int) -> list[dict[str, Any]]:
    return [
        {"video_id": f"w{i}", "creator_id": f"c{i % 3}", "category": "k", "tags": ["t"],
         "duration_ms": 60_000, "uploaded_at": now - 60_000 * i}
        for i in range(12)
    ]


def _backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if name == "memory":
        return {}
    broker = request.getfixturevalue("kafka_broker")
    return {
        "redis": {"url": request.getfixturevalue("redis_url")},
        "sparse": {"backend": "redis"},
        "stores": {"backend": "redis"},
        "event_log": {"backend": "kafka", "topic_namespace": f"ss{uuid.uuid4().hex[:8]}"},
        "kafka": {"bootstrap_servers": broker.bootstrap, "partitions": 2,
                  "session_timeout_ms": 2000, "heartbeat_interval_ms": 200},
    }


@pytest.mark.parametrize(
    "backend", ["memory", pytest.param("redis-kafka", marks=[pytest.mark.redis, pytest.mark.kafka])]
)
def test_without_a_trainer_a_watched_video_is_excluded_and_the_history_moves(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    settings = make_settings(tmp_path / "data", **_backend(backend, tmp_path, request))
    app = create_app(settings)  # the service alone: no trainer in this process or any other
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        now = int(time.time() * 1000)
        assert http.put("/v1/videos", json={"videos": _catalog(now)}, headers=KEY).is_success
        ask = {"user_id": "zoe", "count": 12}
        first = wait_for(lambda: http.post("/v1/recommend", json=ask).json()["items"], 60)
        watched = first[0]["video_id"]
        play = {"event_id": "zoe-1", "user_id": "zoe", "video_id": watched, "type": "play",
                "ts": int(time.time() * 1000), "watch_ms": 50_000, "duration_ms": 60_000}
        assert http.post("/v1/events", json={"events": [play]}, headers=KEY).is_success

        def excluded() -> bool:
            items = http.post("/v1/recommend", json=ask).json()["items"]
            return bool(items) and watched not in {i["video_id"] for i in items}

        wait_for(excluded, 60)
        resources = app.state.service.resources
        assert [h.video_id for h in resources.activity.history("zoe")] == [watched]
        assert resources.activity.video_stats([watched])[0].plays == 1
        assert resources.training_activity.history("zoe") == []  # the trainer's own copy
        again = {**ask, "exclude_seen": False}
        assert watched in {i["video_id"] for i in http.post("/v1/recommend", json=again).json()[
            "items"]}


def test_a_batch_the_feed_failed_to_record_is_recorded_by_its_next_step(tmp_path: Path) -> None:
    """A Redis blip fails a step after the consumer moved past its records: the next step
    records that batch before polling on, and nothing is committed past it meanwhile."""
    with (
        open_resources(make_settings(tmp_path / "data")) as resources,
        serving_signals(resources) as signals,
        serving_feedback(resources) as feedback,
    ):
        feed = SignalFeed(resources, signals, feedback)
        consumer = resources.event_log.consumer(feed_group(resources))
        record = resources.activity.record
        calls = []

        def blip(*args: Any, **kwargs: Any) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise StoreUnavailable("redis blip")
            record(*args, **kwargs)

        resources.activity.record = blip  # type: ignore[method-assign]
        now = int(time.time() * 1000)
        resources.event_log.produce([Event(event_id="e1", user_id="yan", video_id="w1",
                                           type="finish", ts=now, watch_ms=60_000)])
        with pytest.raises(StoreUnavailable):
            wait_for(lambda: feed.step(consumer), 10)
        assert resources.activity.history("yan") == [] and consumer.committed() == []
        assert feed.step(consumer) == 1
        assert [h.video_id for h in resources.activity.history("yan")] == ["w1"]
        consumer.close()
