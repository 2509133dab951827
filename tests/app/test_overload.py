"""Overload: liveness off the scoring path, bounded concurrency, deadlines, fast refusals.

Real uvicorn on real sockets (the event loop is what is tested). Scoring or
producing is held on a lock the test owns, so "busy" is a condition, not a
load: no timing is asserted (the figures are ``bench/bench_overload.py``'s).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.server import FreezeAfterStartup
from feature_store.errors import ConfigurationError
from feature_store.settings import Settings
from tests.app.conftest import KEY, make_settings, serve_in_thread, wait_for
from tests.factories import make_event


class Held:
    """Wraps a callable so that calls wait while the test holds the lock; counts calls."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = 0
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered += 1
        self.calls.append((args, kwargs))
        self.gate.wait(60)
        return self.inner(*args, **kwargs)

    def release(self) -> None:
        self.gate.set()


@contextmanager
def running(settings: Settings) -> Iterator[tuple[str, Any]]:
    app = create_app(settings)
    with serve_in_thread(app) as url:
        yield url, app.state.service


def in_background(pool: ThreadPoolExecutor, url: str, path: str, **kwargs: Any) -> Future[Any]:
    return pool.submit(lambda: httpx.post(url + path, timeout=60, **kwargs))


def sample(url: str, name: str, **labels: str) -> float:
    """The value of one series on ``/metrics`` (0 when absent)."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    for line in httpx.get(url + "/metrics").text.splitlines():
        series, _, value = line.rpartition(" ")
        metric_name, _, label_text = series.partition("{")
        if metric_name == name and set(filter(None, label_text.rstrip("}").split(","))) == wanted:
            return float(value)
    return 0.0


def test_liveness_answers_while_scoring_is_blocked_and_refusals_are_immediate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.degraded")
    settings = make_settings(
        tmp_path / "data", api={"max_concurrent_recommends": 2, "recommend_deadline_ms": 60_000}
    )
    with running(settings) as (url, service), ThreadPoolExecutor(4) as pool:
        held = Held(service.recommender.recommend)
        service.recommender.recommend = held
        first = in_background(pool, url, "/v1/recommend", json={"user_id": "u1"})
        second = in_background(pool, url, "/v1/recommend", json={"user_id": "u2"})
        wait_for(lambda: held.entered == 1 and service.scoring.busy_for_s() > 0, 30)
        wait_for(lambda: sample(url, "vidrec_in_flight", route="/v1/recommend") == 2, 30)
        # Scoring is stuck on the lock: the loop still answers liveness and readiness...
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}
        assert httpx.get(url + "/readyz").status_code == 200
        # ...and refuses a third recommend at once, with Retry-After, naming why.
        refused = httpx.post(url + "/v1/recommend", json={"user_id": "u3"})
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "Overloaded"
        assert "in flight" in refused.json()["message"]
        for _ in range(4):
            assert httpx.post(url + "/v1/recommend", json={"user_id": "u3"}).status_code == 503
        assert sample(url, "vidrec_shed_total", route="/v1/recommend", reason="limit") == 5
        refusal_lines = [r for r in caplog.records if "refused (overloaded)" in r.getMessage()]
        assert len(refusal_lines) == 1  # the first; the others are summarised, counted
        # Other routes are not gated by it.
        assert httpx.get(url + "/v1/videos/nope").status_code == 404
        held.release()
        assert first.result().status_code == 200 and second.result().status_code == 200
        # Back to normal as soon as the slots are free.
        wait_for(lambda: sample(url, "vidrec_in_flight", route="/v1/recommend") == 0, 30)
        again = httpx.post(url + "/v1/recommend", json={"user_id": "u3"})
        assert again.status_code == 200 and again.json()["fallback_reason"] != "deadline"


def test_a_recommend_past_its_deadline_is_answered_degraded_and_its_scoring_never_starts(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path / "data", api={"recommend_deadline_ms": 300})
    with running(settings) as (url, service), ThreadPoolExecutor(4) as pool:
        held = Held(service.recommender.recommend)
        service.recommender.recommend = held
        stuck = in_background(pool, url, "/v1/recommend", json={"user_id": "u1"})
        wait_for(lambda: held.entered == 1, 30)
        # Queued behind the stuck scoring: answered from memory while the lock is held.
        queued = httpx.post(url + "/v1/recommend", json={"user_id": "u2", "count": 3}, timeout=60)
        assert not held.gate.is_set()
        body = queued.json()
        assert queued.status_code == 200
        assert body["fallback"] and body["degraded"] and body["fallback_reason"] == "deadline"
        assert len(body["recommendation_id"]) == 32
        assert stuck.result().json()["fallback_reason"] == "deadline"  # its deadline passed too
        held.release()
        # Once the thread has passed everything queued before this marker, the queued
        # request's scoring would have run: it was dropped instead.
        service.scoring._executor.submit(lambda: None).result(timeout=60)
        assert [call[0][0].user_id for call in held.calls] == ["u1"]
        assert sample(url, "vidrec_shed_total", route="/v1/recommend", reason="deadline") == 2
        assert sample(url, "vidrec_fallbacks_total", reason="deadline") == 2


def test_liveness_fails_only_when_one_scoring_is_stuck_past_its_bound(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path / "data", redis={"socket_timeout_s": 0.2},
        api={"liveness_stuck_s": 1.0, "recommend_deadline_ms": 60_000},
    )
    with running(settings) as (url, service), ThreadPoolExecutor(2) as pool:
        held = Held(service.recommender.recommend)
        service.recommender.recommend = held
        answer = in_background(pool, url, "/v1/recommend", json={"user_id": "u1"})
        wait_for(lambda: held.entered == 1, 30)
        stuck = wait_for(lambda: (r := httpx.get(url + "/healthz")).status_code == 503 and r, 30)
        assert stuck.json()["status"] == "stuck"
        held.release()
        assert answer.result().status_code == 200
        wait_for(lambda: httpx.get(url + "/healthz").status_code == 200, 30)


def test_the_liveness_bound_must_exceed_a_backend_timeout(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="liveness_stuck_s"):
        make_settings(tmp_path, api={"liveness_stuck_s": 3.0})  # Redis may take 2 s a call


def event(n: int) -> dict[str, Any]:
    return make_event(event_id=f"e{n}", ts=1_763_700_000_000 + n).model_dump(mode="json")


def test_ingest_over_its_limit_is_refused_at_once_and_the_broker_gets_the_remaining_deadline(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path / "data",
        api={"max_concurrent_ingests": 1, "ingest_deadline_ms": 5_000},
        kafka={"produce_timeout_ms": 10_000},
    )
    with running(settings) as (url, service), ThreadPoolExecutor(2) as pool:
        log = service.resources.event_log
        held = Held(log.produce)
        log.produce = held
        first = in_background(pool, url, "/v1/events", json={"events": [event(1)]}, headers=KEY)
        wait_for(lambda: held.entered == 1, 30)
        refused = httpx.post(url + "/v1/events", json={"events": [event(2)]}, headers=KEY)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "Overloaded"
        assert sample(url, "vidrec_shed_total", route="/v1/events", reason="limit") == 1
        held.release()
        assert first.result().status_code == 200
        # The acknowledgement may take what is left of the request's 5 s (by 90 %), not
        # the broker's whole 10 s budget.
        assert 0 < held.calls[0][1]["timeout_s"] <= 4.5
        assert httpx.get(url + "/healthz").status_code == 200


def test_the_server_freezes_what_start_up_built_once_it_has_started() -> None:
    """``vidrec serve`` keeps start-up's objects out of collections (a full collection
    walking them stalls the event loop); requests pass through untouched."""
    seen: list[tuple[str, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        await send({"type": f"{message['type']}.complete"})

    async def receive() -> dict[str, str]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        seen.append((message["type"], gc.get_freeze_count()))

    try:
        assert gc.get_freeze_count() == 0
        asyncio.run(FreezeAfterStartup(app)({"type": "lifespan"}, receive, send))
        assert seen[0][0] == "lifespan.startup.complete" and seen[0][1] > 0
    finally:
        gc.unfreeze()
    seen.clear()

    async def http_receive() -> dict[str, str]:
        return {"type": "lifespan.startup"}  # what the wrapped app reads, unchanged

    asyncio.run(FreezeAfterStartup(app)({"type": "http"}, http_receive, send))
    assert seen == [("lifespan.startup.complete", 0)]


FIRST_REQUESTS = '''
import json, sys, threading, time, http.client
import uvicorn
from app.main import create_app
from tests.app.conftest import KEY, make_settings
from tests.factories import make_event
from tests.services import free_port

settings = make_settings(__import__("pathlib").Path(sys.argv[1]))
port = free_port()
server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                       log_config=None, access_log=False))
thread = threading.Thread(target=server.run, daemon=True)
thread.start()
while not server.started and thread.is_alive():
    time.sleep(0.02)
if not server.started:
    sys.exit("the app failed to start (see the log above)")

def post(path, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", path, json.dumps(body), {**KEY, "content-type": "application/json"})
    return connection.getresponse().status

event = json.loads(make_event().model_dump_json(exclude_none=True))
started = set(sys.modules)
statuses = [post("/v1/events", {"events": [event]}),
            post("/v1/recommend", {"user_id": "u1", "candidates": ["v1", "v2"]})]
print(json.dumps({"statuses": statuses, "imported": sorted(set(sys.modules) - started)}))
server.should_exit = True
'''


def test_a_fresh_servers_first_requests_import_nothing_on_its_event_loop(tmp_path: Path) -> None:
    """An import on the event loop holds every request it has: the first event post
    imported anyio's thread-pool backend there, the slowest refusals under load. A
    fresh interpreter, since this one has imported everything already."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_REQUESTS, str(tmp_path / "data")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["statuses"] == [200, 200]
    assert answer["imported"] == []
