"""Load shedding: what a process refuses, so that what it admits is answered in time.

Under more requests than it can serve, a server that queues them all answers
every one late: issue #22 measured p99s of seconds, an 85 s stall after a
broker outage, and ``/healthz`` timing out behind scoring on the event loop.
Here (``docs/deploy.md``, *Overload*):

- **Admission** (:class:`Admission`, a pure ASGI middleware): at most
  ``api.max_concurrent_recommends`` recommends and
  ``api.max_concurrent_ingests`` event posts in flight per process. One more
  is refused at once, before its body is read, with 503 ``Overloaded`` and
  ``Retry-After`` (``api.shed_retry_after_s``). There is no waiting room: a
  request has a slot or is refused, so no queue grows for minutes.
- **Deadlines**: an admitted request carries the time by which it must be
  answered (:func:`deadline_of`): ``api.recommend_deadline_ms`` or
  ``api.ingest_deadline_ms`` after admission. Work stops at
  :data:`WORK_SHARE` of it; the rest is for the answer to reach the client.
  A recommend not scored by then is answered from the in-memory popular list
  (``degraded``, ``fallback_reason: "deadline"``); an event post gets 503
  with ``Retry-After`` (nothing acknowledged: resend).
- **The scoring thread** (:class:`ScoringThread`): recommends are scored on
  one thread of their own, not on the event loop, so the loop only reads,
  admits, refuses and writes. ``/healthz`` and refusals never wait behind
  scoring, nor behind ingest (which runs in the web server's thread pool).
  A recommend whose scoring had not started by its deadline never starts.

Counted on ``/metrics``: ``vidrec_shed_total{route, reason}`` (``limit``:
refused at admission; ``deadline``: answered degraded or 503 past its
deadline) and ``vidrec_in_flight{route}``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from app.metrics import ROUTE_HINT, Metrics
from feature_store.errors import Overloaded, VidrecError
from feature_store.settings import ApiSettings

T = TypeVar("T")

DEADLINE = "vidrec.deadline"
"""Scope key: ``time.monotonic()`` by which the request's work must end (None: no gate)."""
WORK_SHARE = 0.9
"""Share of a request's deadline its work may take; the rest is for the answer (a
degraded recommend, a 503) to be made and to reach the client."""

RECOMMEND = "/v1/recommend"
EVENTS = "/v1/events"


@dataclass
class Gate:
    """At most ``limit`` requests of one route in flight; each with a deadline."""

    route: str
    limit: int
    deadline_s: float
    """Seconds from admission to the answer."""
    in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def enter(self) -> bool:
        with self._lock:
            if self.in_flight >= self.limit:
                return False
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


def gates(api: ApiSettings) -> dict[tuple[str, str], Gate]:
    """The gated routes of the API, by (method, path)."""
    return {
        ("POST", RECOMMEND): Gate(
            RECOMMEND, api.max_concurrent_recommends, api.recommend_deadline_ms / 1000
        ),
        ("POST", EVENTS): Gate(EVENTS, api.max_concurrent_ingests, api.ingest_deadline_ms / 1000),
    }


def _in_flight_of(gate: Gate) -> Callable[[], float]:
    """``vidrec_in_flight``'s value for one gate, read at scrape time."""
    return lambda: float(gate.in_flight)


def deadline_of(scope: Scope) -> float | None:
    """When the request's work must end (``time.monotonic()``); None when ungated."""
    deadline = scope.get(DEADLINE)
    return deadline if isinstance(deadline, float) else None


class Admission:
    """ASGI middleware admitting gated requests or refusing them at once (module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        gates: dict[tuple[str, str], Gate],
        metrics: Metrics,
        retry_after_s: int,
    ) -> None:
        self.app = app
        self.gates = gates
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        for gate in gates.values():
            metrics.in_flight.labels(gate.route).set_function(_in_flight_of(gate))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = (
            self.gates.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        )
        if gate is None:
            await self.app(scope, receive, send)
            return
        scope[ROUTE_HINT] = gate.route
        if not gate.enter():
            self.metrics.shed.labels(gate.route, "limit").inc()
            refusal = Overloaded(
                f"{gate.limit} {gate.route} requests in flight, the most this process "
                "serves at once; nothing was done",
                retry_after_s=self.retry_after_s,
            )
            service = getattr(getattr(scope.get("app"), "state", None), "service", None)
            if service is not None:  # one log line per interval, with the count
                service.log_summary.record(f"{gate.route} refused (overloaded)", refusal)
            await send_error(send, refusal)
            return
        scope[DEADLINE] = time.monotonic() + gate.deadline_s * WORK_SHARE
        try:
            await self.app(scope, receive, send)
        finally:
            gate.leave()


async def send_error(send: Send, error: VidrecError, close: bool = False) -> None:
    """Answer ``error`` in the one error shape, from a middleware (no router needed)."""
    payload = json.dumps(error.to_dict()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class ScoringThread:
    """The one thread recommends are scored on, off the event loop (see the module doc).

    One thread, as the event loop was before: a worker scores one request at
    a time (scoring is CPU under the GIL; more threads only trade the GIL),
    and the process scales by processes. :attr:`busy_for_s` lets liveness
    tell a stuck scoring (a deadlock) from a busy process.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vidrec-scoring")
        self._started: float | None = None

    def _timed(self, work: Callable[[], T]) -> T:
        self._started = time.monotonic()
        try:
            return work()
        finally:
            self._started = None

    async def run(self, work: Callable[[], T], deadline: float | None) -> T | None:
        """``work()``'s result, or None when ``deadline`` (``time.monotonic()``) came
        first: then its result is dropped, and if it had not started it never runs."""
        # In the caller's context: a trace's spans (contextvars) continue on the thread.
        context = contextvars.copy_context()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, context.run, self._timed, work
        )
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None

    def busy_for_s(self) -> float:
        """Seconds the current scoring has run (0 when idle)."""
        started = self._started
        return 0.0 if started is None else time.monotonic() - started

    def close(self) -> None:
        """Drop what waits; let a running scoring finish (it holds no lock of ours)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
