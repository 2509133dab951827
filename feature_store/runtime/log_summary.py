"""One log line per interval for things that happen per request, with counts.

During an outage or an overload every request can go wrong the same way; a
WARNING per request floods the log (thousands of lines a second) and buries
the lines that say what changed. :class:`LogSummary` logs the first
occurrence of each kind at once, counts the ones after it, and writes one
line per ``every_s`` while they go on: ``recommend degraded: 1,234 times in
the last 10.0 s (last: Redis at 127.0.0.1:6379 is down ...)``. The exact
counts are on ``/metrics`` too; the log says when and why.

The summary line is written by a timer thread at the end of the interval (a
daemon, started only while something is pending), so the last count of an
episode is not held back until the next occurrence.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass


@dataclass
class _Pending:
    count: int = 0
    last: str = ""


class LogSummary:
    """Rate-limited logging of repeated events by kind (see the module docstring)."""

    def __init__(
        self, logger: logging.Logger, level: int = logging.WARNING, every_s: float = 10.0
    ) -> None:
        self.logger = logger
        self.level = level
        self.every_s = every_s
        """Seconds between summary lines of one kind."""
        self._lock = threading.Lock()
        self._next_line: dict[str, float] = {}
        """Per kind, ``time.monotonic()`` before which it is only counted."""
        self._pending: dict[str, _Pending] = {}
        self._timer: threading.Timer | None = None
        self._closed = False

    def record(self, kind: str, detail: object) -> None:
        """One occurrence of ``kind`` (e.g. ``recommend degraded``), ``detail`` its cause."""
        now = time.monotonic()
        with self._lock:
            if now >= self._next_line.get(kind, 0.0) and kind not in self._pending:
                self._next_line[kind] = now + self.every_s
                first = True
            else:
                pending = self._pending.setdefault(kind, _Pending())
                pending.count += 1
                pending.last = str(detail)
                first = False
                self._arm_timer(now)
        if first:
            self.logger.log(
                self.level, "%s: %s (repeats are summarised every %.0f s)",
                kind, detail, self.every_s,
            )

    def _arm_timer(self, now: float) -> None:
        """Start the timer for the earliest pending summary (the lock is held)."""
        if self._timer is not None or self._closed:
            return
        due = min(self._next_line.get(kind, now) for kind in self._pending)
        self._timer = threading.Timer(max(0.0, due - now), self._flush_due)
        self._timer.daemon = True
        self._timer.name = "vidrec-log-summary"
        self._timer.start()

    def _flush_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            due = [k for k in self._pending if self._next_line.get(k, 0.0) <= now]
            lines = [(kind, self._pending.pop(kind)) for kind in due]
            for kind in due:
                self._next_line[kind] = now + self.every_s
            if self._pending:
                self._arm_timer(now)
        for kind, pending in lines:
            self._write(kind, pending)

    def _write(self, kind: str, pending: _Pending) -> None:
        self.logger.log(
            self.level, "%s: %s more times in the last %.1f s (last: %s)",
            kind, f"{pending.count:,}", self.every_s, pending.last,
        )

    def close(self) -> None:
        """Write what is pending now and stop the timer."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
            lines = list(self._pending.items())
            self._pending.clear()
        if timer is not None:
            timer.cancel()
        for kind, pending in lines:
            self._write(kind, pending)
