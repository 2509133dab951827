"""Background threads, started and stopped the same way everywhere.

Every background loop in vidrec (the model poller, the popular-list
refresher, the dashboard sampler, the feeds, the control listener, the
trainer's thread, the Kafka log's background connect...) is a
:class:`Worker`: a named daemon thread with a stop event its loop waits on,
so stopping never waits out a sleep. Its owner creates it in ``__init__``,
calls :meth:`Worker.start` from its own ``start`` and :meth:`Worker.stop`
from its ``close`` (whoever starts a thread stops it). Threads started for
one job that end by themselves (an index build, a dense-sync round, a
breaker's prober, a summary's timer) are not Workers; ``docs/architecture.md``
lists them. Daemon, so a process that dies without closing is not kept alive
by it; the join in ``stop`` is bounded for the same reason.

:func:`periodic` is the common loop: call ``tick`` every ``every_s``
seconds, log and survive whatever it raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)


class Worker:
    """A named daemon thread running ``run(stop)``; ``stop`` is set to end it."""

    def __init__(
        self, name: str, run: Callable[[threading.Event], None], *, join_timeout_s: float = 10.0
    ) -> None:
        self.name = name
        self.stop_event = threading.Event()
        """Set by :meth:`stop`; the loop waits on it (``stop_event.wait(s)``), never sleeps."""
        self.join_timeout_s = join_timeout_s
        """Seconds :meth:`stop` waits for the loop to end before leaving the daemon behind."""
        self._run = run
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the thread; a no-op while it runs. A stopped worker may be started again."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self.stop_event.clear()
            self._thread = threading.Thread(
                target=self._run, args=(self.stop_event,), name=self.name, daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the loop to end and wait for it (at most ``timeout_s``, default the worker's)."""
        self.stop_event.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(self.join_timeout_s if timeout_s is None else timeout_s)

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        """The current thread, if started (to tell whether a caller runs on it)."""
        return self._thread

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def periodic(
    name: str,
    every_s: float | Callable[[], float],
    tick: Callable[[], object],
    *,
    join_timeout_s: float = 10.0,
) -> Worker:
    """A worker calling ``tick`` every ``every_s`` seconds (a number, or read each time).

    The first call comes one interval after start (call ``tick`` yourself
    first if the state must be fresh at once). An exception is logged with
    the worker's name and the loop goes on: a background loop outlives any
    surprise.
    """
    interval = every_s if callable(every_s) else (lambda: every_s)

    def run(stop: threading.Event) -> None:
        while not stop.wait(interval()):
            try:
                tick()
            except Exception:
                log.exception("%s: background tick failed", name)

    return Worker(name, run, join_timeout_s=join_timeout_s)
