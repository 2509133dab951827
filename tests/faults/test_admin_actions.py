"""Admin actions waiting on a trainer that never answers hold nothing health or ingest need.

41 such actions used to block ``/healthz`` and ``POST /v1/events`` for a
minute (each held a web worker thread). Now 100 wait at once while health
and ingest answer (answers that arrive while every action still waits; how
fast is the benchmark's to say: it prints the p99), a 101st is refused with
429, and an id names one action: resent with the same body it answers the
first outcome, with another action it is refused (409).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.app.conftest import KEY, make_settings, serve_in_thread

pytestmark = [pytest.mark.faults]

PENDING = 100


async def _pending_actions_and_probes(url: str, runner: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"health": [], "events": []}
    limits = httpx.Limits(max_connections=PENDING + 10)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        actions = [
            asyncio.create_task(http.post(
                "/dashboard/api/actions/pause", json={"id": f"pending-{i:04d}"}, headers=KEY
            ))
            for i in range(PENDING)
        ]
        deadline = time.monotonic() + 30  # a loaded machine takes a while to send them all
        while runner.pending < PENDING and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        out["over"] = await http.post("/dashboard/api/actions/export", json={}, headers=KEY)
        n = 0
        while not all(task.done() for task in actions):
            health = await http.get("/healthz")
            out["health"].append((health.status_code, runner.pending == PENDING))
            event = {"event_id": f"pa{n}", "user_id": "u1", "video_id": "v1", "type": "finish",
                     "ts": int(time.time() * 1000)}
            posted = await http.post("/v1/events", json={"events": [event]}, headers=KEY)
            out["events"].append((posted.status_code, runner.pending == PENDING))
            n += 1
            await asyncio.sleep(0.05)
        out["actions"] = [task.result() for task in actions]
        out["again"] = await http.post(
            "/dashboard/api/actions/pause", json={"id": "pending-0000"}, headers=KEY
        )
        out["reused"] = await http.post(
            "/dashboard/api/actions/resume", json={"id": "pending-0000"}, headers=KEY
        )
    return out


def test_pending_actions_are_bounded_and_block_neither_health_nor_ingest(tmp_path: Path) -> None:
    # Long enough that the first action still waits when the last one is sent, however
    # slowly a loaded machine sends them; the test waits for every one to time out.
    settings = make_settings(tmp_path / "data", dashboard={"ack_timeout_s": 10.0})
    app = create_app(settings)
    with serve_in_thread(app) as url:  # no trainer: nobody acknowledges
        runner = app.state.dashboard.actions
        # In a thread of its own: another test may have left this thread's event loop running.
        with ThreadPoolExecutor(1) as thread:
            out = thread.submit(
                lambda: asyncio.run(_pending_actions_and_probes(url, runner))
            ).result()
    assert out["over"].status_code == 429 and "Retry-After" in out["over"].headers
    statuses = [a.json()["status"] for a in out["actions"]]
    assert [a.status_code for a in out["actions"]] == [200] * PENDING
    assert statuses == ["timeout"] * PENDING
    assert len(out["health"]) >= 10, "the probes did not run while actions waited"
    assert {status for status, _ in out["health"]} == {200}
    assert {status for status, _ in out["events"]} == {200}
    # Answered while all 100 still waited (each probe is read as it completes): waiting
    # actions hold nothing health or ingest need.
    for probe in ("health", "events"):
        assert sum(waiting for _, waiting in out[probe]) >= 3, probe
    again = out["again"]
    assert again.status_code == 200 and again.json()["status"] == "timeout"
    assert again.json()["ts_ms"] == out["actions"][0].json()["ts_ms"], "not the first outcome"
    assert out["reused"].status_code == 409 and out["reused"].json()["error"] == "Conflict"
