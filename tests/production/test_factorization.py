"""The live factorisation across processes: the trainer's fits and fold-ins reach the API.

The production topology (``stack.py``): a trainer process fits the users' plays
and writes the factors to Redis (``feature_store/factors/redis.py``); the API
process reads the newest fit and the asking user's row at each request. A new
user's plays are folded in by the trainer and give that user a factorisation
term in the API's ranking, with no export needed between (issue #21).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.production.stack import (
    KEY,
    Production,
    plays,
    post,
    production_env,
    seed_catalog,
    wait_until,
)
from tests.services import TansuBroker

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]


def _fitted(prod: Production) -> int:
    """Fits of the trainer's live factorisation, from its heartbeat."""
    sequence = prod.status().get("sequence") or {}
    return int((sequence.get("factorization") or {}).get("fits") or 0)


def _served_fit(http: httpx.Client) -> dict[str, Any] | None:
    """The newest fit as the API process reads it (``/v1/status``)."""
    found = http.get("/v1/status", headers=KEY).json().get("factorization")
    return found if isinstance(found, dict) and found.get("videos") else None


def _bonuses(http: httpx.Client, user: str) -> list[float] | None:
    """The factorisation term of each item of ``user``'s explained top 10 (None: no model
    has ranked it yet)."""
    body = http.post("/v1/recommend",
                     json={"user_id": user, "count": 10, "explain": True}).json()
    if not body.get("model_version") or body.get("explanation") is None:
        return None
    return [item["explanation"]["factorization_bonus"] for item in body["items"]]


def test_a_new_users_plays_reach_their_term_in_the_api_process(
    tmp_path: Path, redis_url: str, durable_broker: TansuBroker
) -> None:
    prod = Production(tmp_path, production_env(redis_url, durable_broker.bootstrap))
    trainer = prod.trainer("trainer")
    try:
        prod.start_serve()
        videos = seed_catalog(prod.url, 30)
        trainer.start()
        with httpx.Client(base_url=prod.url, timeout=30) as http:
            post(http, plays(20, videos, 400, "warm"))  # every other play a long one
            wait_until(lambda: _fitted(prod) >= 1, 180, "the trainer's first fit")
            wait_until(lambda: _served_fit(http), 60, "the API process to read the fit")
            wait_until(lambda: _bonuses(http, "pu1") is not None, 120, "a served model")
            assert _bonuses(http, "fresh") == [0.0] * len(_bonuses(http, "fresh") or [])

            now = int(time.time() * 1000)
            mine = [{"event_id": f"fresh-{i}", "user_id": "fresh", "video_id": videos[i],
                     "type": "play", "watch_ms": 55_000, "duration_ms": 60_000, "ts": now + i}
                    for i in range(3)]
            post(http, mine)
            # Folded in by the trainer process, read by the API process: a term appears.
            wait_until(lambda: min(_bonuses(http, "fresh") or [0.0]) < 0, 60,
                       "the new user's factor in the API's ranking")
    finally:
        prod.close()
