"""``vidrec serve`` with no broker reachable: it starts, recommends, and refuses events fast.

It used to listen on nothing for 30 s and then exit. Now Kafka is connected
in the background: recommendations are answered at once (from Redis), event
posts get 503 with ``Retry-After`` within a second, and once a broker
answers on the configured address the same process accepts events.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import KEY, stack_env, stop, vidrec, wait_until
from tests.services import RedisServer, TansuBroker, free_port, wait_for_port

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]


def test_serve_starts_and_answers_while_no_broker_answers(tmp_path: Path) -> None:
    broker_port = free_port()  # nothing listens there yet
    port = free_port()
    with RedisServer() as redis:
        env = stack_env(tmp_path / "data", redis.url, f"127.0.0.1:{broker_port}", "nobroker")
        serve = vidrec(["serve", "--port", str(port)], env, tmp_path / "serve.log")
        broker = TansuBroker(port=broker_port)
        try:
            wait_for_port(port, 60, serve)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                assert http.get("/healthz").status_code == 200
                ready = http.get("/readyz")
                assert ready.status_code == 200 and ready.json()["degraded"] is True
                assert ready.json()["checks"]["event_log"].startswith("down")
                answer = http.post("/v1/recommend", json={"user_id": "u1", "count": 5})
                assert answer.status_code == 200, answer.text
                event = {"event_id": "s1", "user_id": "u1", "video_id": "v1", "type": "finish",
                         "ts": int(time.time() * 1000)}
                started = time.monotonic()
                refused = http.post("/v1/events", json={"events": [event]}, headers=KEY)
                assert time.monotonic() - started < 1.0  # the bound the issue names
                assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
                assert refused.json()["error"] == "EventLogUnavailable"

                broker.start()  # the broker appears: the same process connects and accepts
                wait_until(
                    lambda: http.post(
                        "/v1/events", json={"events": [event]}, headers=KEY
                    ).status_code == 200,
                    60, "events to be accepted once the broker answers", every_s=0.5,
                )
                wait_until(lambda: http.get("/readyz").json()["checks"]["event_log"] == "ok",
                           10, "readyz to see the broker")
            assert serve.poll() is None, "the service exited"
        finally:
            stop(serve)
            broker.stop()
            print((tmp_path / "serve.log").read_text()[-3000:])
