"""The trainer paused, then stopped: serving's state keeps up (exclude_seen, history features).

The production topology (``stack.py``). An operator pauses the trainer from
the dashboard, then stops it; meanwhile a user plays videos. Each one is
excluded from the user's recommendations and shows in the history the
service reads (the dashboard's user view: what ``exclude_seen`` and the
history features read), written by the service's signal feed; the trainer's
own copy (its point-in-time features) takes them only once it trains again
(issue #22: the trainer alone wrote histories, so users were served what
they had just watched while it was paused, lagging or down).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from feature_store.constants import TRAINING_HISTORY
from tests.production.stack import (
    KEY,
    Production,
    post,
    production_env,
    seed_catalog,
    wait_until,
)
from tests.services import TansuBroker

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]

ADMIN = {**KEY, "X-Operator": "ops"}


def _recommended(http: httpx.Client, user: str) -> list[str]:
    body = http.post("/v1/recommend", json={"user_id": user, "count": 10}).json()
    return [item["video_id"] for item in body["items"]]


def _watch(http: httpx.Client, user: str, video: str, n: int) -> None:
    """Post one play, resent after a 503's ``Retry-After`` as a client does (the service
    answers 503 until it has connected to the broker, and while a send outlasts its
    budget on a loaded machine)."""
    play = {"event_id": f"{user}-{n}", "user_id": user, "video_id": video, "type": "play",
            "ts": int(time.time() * 1000), "watch_ms": 50_000, "duration_ms": 60_000}
    post(http, [play])


def _served_history(http: httpx.Client, user: str) -> list[str]:
    body = http.get(f"/dashboard/api/users/{user}", headers=KEY).json()
    return [entry["video_id"] for entry in body["history"]]


def test_exclude_seen_and_history_keep_up_with_the_trainer_paused_then_stopped(
    tmp_path: Path, redis_url: str, durable_broker: TansuBroker
) -> None:
    prod = Production(tmp_path, production_env(redis_url, durable_broker.bootstrap))
    trainer = prod.trainer("trainer")
    try:
        prod.start_serve()
        seed_catalog(prod.url, 30)
        trainer.start()
        with httpx.Client(base_url=prod.url, timeout=30) as http:
            _watch(http, "warm", "pv0", 0)  # the trainer has been running a while
            wait_until(lambda: prod.status().get("events_total", 0) >= 1, 120, "a first batch")
            paused = http.post("/dashboard/api/actions/pause", json={}, headers=ADMIN).json()
            assert paused["status"] == "done", paused
            wait_until(lambda: prod.status().get("state") == "paused", 30, "the heartbeat")

            first = wait_until(lambda: _recommended(http, "pat"), 60, "recommendations")[0]
            _watch(http, "pat", first, 1)
            wait_until(lambda: first not in _recommended(http, "pat"), 30, "exclusion (paused)")
            assert _served_history(http, "pat") == [first]

            assert trainer.stop() == 0  # stopped: no trainer at all now
            second = _recommended(http, "pat")[0]
            _watch(http, "pat", second, 2)
            wait_until(lambda: second not in _recommended(http, "pat"), 30, "exclusion (stopped)")
            assert _served_history(http, "pat") == [second, first]
            assert first not in _recommended(http, "pat")

            client = prod.redis()
            try:
                assert client.llen(TRAINING_HISTORY + "pat") == 0  # the trainer saw neither
                trainer.start()  # back (not paused: a new process), it catches up
                wait_until(lambda: client.llen(TRAINING_HISTORY + "pat") == 2, 120,
                           "the trainer's own copy to catch up")
            finally:
                client.close()
    finally:
        prod.close()
