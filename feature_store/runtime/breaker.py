"""Circuit breakers: a dependency known to be down costs a caller microseconds.

Without one, every request during a Redis outage paid redis-py's connect
retries and their backoff (about 310 ms, on the service's event loop), and
every event post during a broker outage waited for kafka-python's timeouts
(up to 31 s, holding a thread). A :class:`Breaker` remembers that a
dependency failed; while it is *down*, :meth:`Breaker.allow` answers False
at once and the caller fails fast with its usual error (the service then
answers degraded, or 503 with ``Retry-After``).

How it comes back up, two ways:

- with a ``probe`` (Redis): a daemon thread calls it every ``retry_s``
  until it succeeds, so no request ever waits on a dead or hung server;
  it holds only a weak reference, and ends when the breaker is closed or
  garbage collected;
- without one (the Kafka producer): *half-open*, one caller every
  ``retry_s`` is let through as a trial (the ingest route bounds what that
  trial may cost); its success closes the breaker.

A success seen by any caller closes it too. States are reported by
``/readyz`` and as ``vidrec_dependency_up`` on ``/metrics``.

:class:`BreakerConnection` puts a breaker in front of every connection of a
redis-py client (:func:`feature_store.sparse.factory.connect_redis` uses it);
:func:`redis_breaker` finds a client's breaker.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import AbstractBackoff
from redis.connection import Connection

log = logging.getLogger(__name__)

PROBE_EVERY_S = 0.25
"""Seconds between probes (or half-open trials) of a dependency that is down."""


class Breaker:
    """Up/down state of one dependency; see the module docstring."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], object] | None = None,
        retry_s: float = PROBE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.retry_s = retry_s
        self.clock = clock
        """Monotonic seconds: when it went down, when the next half-open trial is due
        (tests pass a clock they move by hand). The prober thread waits real time."""
        self.probe = probe
        """Checks the dependency from the prober thread; None: half-open trials by callers."""
        self._lock = threading.Lock()
        self._down_since: float | None = None
        """``clock()`` when it went down; None while up."""
        self._next_trial = 0.0
        self._prober: threading.Thread | None = None
        self._closed = threading.Event()
        self.last_error: str | None = None
        self.trips = 0
        """Times it went down."""
        self.refused = 0
        """Calls failed fast while down (approximate: counted without the lock)."""

    @property
    def up(self) -> bool:
        return self._down_since is None

    def allow(self) -> bool:
        """Whether a call may go to the dependency now (False: fail fast)."""
        if self._down_since is None:
            return True
        if self.probe is None:
            now = self.clock()
            with self._lock:
                if now >= self._next_trial:  # half-open: this caller is the trial
                    self._next_trial = now + self.retry_s
                    return True
        self.refused += 1
        return False

    def failed(self, exc: BaseException) -> None:
        """A call failed on the dependency itself (not on bad input): mark it down."""
        with self._lock:
            self.last_error = f"{type(exc).__name__}: {exc}"
            if self._down_since is None:
                self._down_since = self.clock()
                self._next_trial = self._down_since + self.retry_s
                self.trips += 1
                log.warning("%s is down (%s); failing fast until it answers", self.name, exc)
            if self.probe is not None and not self._closed.is_set():
                if self._prober is None or not self._prober.is_alive():
                    self._prober = threading.Thread(
                        target=_probe_until_up,
                        args=(weakref.ref(self), self.retry_s, self._closed),
                        name=f"vidrec-probe-{self.name}",
                        daemon=True,
                    )
                    self._prober.start()

    def succeeded(self) -> None:
        """A call (or a probe) got an answer: mark it up."""
        if self._down_since is None:
            return
        with self._lock:
            if self._down_since is not None:
                down_s = self.clock() - self._down_since
                self._down_since = None
                log.warning("%s is back after %.1f s", self.name, down_s)

    def retry_after_s(self) -> int:
        """Whole seconds a client should wait before retrying (``Retry-After``)."""
        return max(1, math.ceil(self.retry_s))

    def state(self) -> dict[str, Any]:
        """For ``/readyz`` and ``/v1/status``: ``up`` or ``down`` since when and why."""
        down_since = self._down_since
        if down_since is None:
            return {"state": "up", "trips": self.trips}
        return {
            "state": "down",
            "down_for_s": round(self.clock() - down_since, 3),
            "error": self.last_error,
            "trips": self.trips,
        }

    def close(self) -> None:
        """Stop probing (the owner is closing the client)."""
        self._closed.set()

    def _run_probe(self) -> bool:
        assert self.probe is not None
        try:
            self.probe()
        except Exception as exc:  # any failure means "still down"
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self.succeeded()
        return True


def _probe_until_up(ref: weakref.ref[Breaker], every_s: float, closed: threading.Event) -> None:
    """The prober thread: probe every ``every_s`` until up, closed or collected."""
    while not closed.wait(every_s):
        breaker = ref()
        if breaker is None or breaker.up or breaker._run_probe():
            return
        del breaker  # hold no strong reference while waiting


class CircuitOpen(redis.RedisError):
    """Redis is known to be down; the call was not sent.

    A :class:`redis.RedisError` so that every store translates it as it
    translates any Redis failure, but not a ``ConnectionError``: redis-py's
    ``Retry`` would otherwise sleep its backoff between fast failures.
    """


class BreakerConnection(Connection):
    """A redis-py connection that consults a :class:`Breaker` before connecting.

    Every command on a fresh or dropped connection goes through
    :meth:`connect_check_health`, so once Redis is down (a connect refused, or a connect
    or handshake timed out) the whole client fails in microseconds. A reply
    that times out or a connection closed mid-command marks it down too.
    """

    def __init__(self, *args: Any, breaker: Breaker, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.breaker = breaker

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's connect (socket and handshake), refused fast while Redis is down."""
        if self._sock is not None:
            return
        breaker = self.breaker
        if not breaker.allow():
            raise CircuitOpen(f"Redis at {self.host}:{self.port} is down: {breaker.last_error}")
        try:
            super().connect_check_health(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            breaker.failed(exc)
            raise
        breaker.succeeded()

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().send_packed_command(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.breaker.failed(exc)
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.breaker.failed(exc)
            raise


class BreakerBackoff(AbstractBackoff):
    """redis-py's retry backoff, but none once the breaker is down.

    The retry that follows then meets :class:`CircuitOpen` at once instead
    of sleeping first: the first request to find Redis gone costs a refused
    connect, not the backoff.
    """

    def __init__(self, inner: AbstractBackoff, breaker: Breaker) -> None:
        self.inner = inner
        self.breaker = breaker

    def reset(self) -> None:
        self.inner.reset()

    def __deepcopy__(self, memo: dict[int, Any]) -> BreakerBackoff:
        """Each connection copies its retry policy; the breaker stays shared."""
        return BreakerBackoff(copy.deepcopy(self.inner, memo), self.breaker)

    def compute(self, failures: int) -> float:
        return self.inner.compute(failures) if self.breaker.up else 0.0


def redis_breaker(client: object) -> Breaker | None:
    """The breaker of a client made by ``connect_redis`` (None for others, e.g. a cluster)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    found = kwargs.get("breaker") if isinstance(kwargs, dict) else None
    return found if isinstance(found, Breaker) else None


def redis_probe(connection_kwargs: dict[str, Any]) -> Callable[[], object]:
    """A probe that opens a plain connection with ``connection_kwargs`` and PINGs."""
    plain = {k: v for k, v in connection_kwargs.items() if k not in ("breaker", "retry")}

    def probe() -> object:
        conn = Connection(**plain)
        try:
            conn.connect()
            conn.send_command("PING")
            return conn.read_response()
        finally:
            conn.disconnect()

    return probe
