"""A plain progress bar on stderr: done/total, rate and ETA (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redrawn in place on a terminal at most every 0.2 s; one line per 10% otherwise."""

    def __init__(
        self, total: int, label: str, unit: str, enabled: bool = True, out: TextIO | None = None
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.unit = unit
        self.enabled = enabled
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._decile = -1
        self._drawn_done = -1

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        decile = self.done * 10 // self.total
        if (self.tty and now - self._drawn >= 0.2) or (not self.tty and decile > self._decile):
            self._drawn, self._decile = now, decile
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = f"{int(left // 60)}:{int(left % 60):02d}" if left == left else "?"
        width = 30
        filled = int(width * min(self.done, self.total) / self.total)
        return (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] "
            f"{100 * self.done / self.total:5.1f}% {self.done:,}/{self.total:,} {self.unit} "
            f"{rate:,.0f} {self.unit}/s ETA {eta}"
        )

    def _draw(self, now: float) -> None:
        self._drawn_done = self.done
        self.out.write(("\r" if self.tty else "") + self.line(now) + ("" if self.tty else "\n"))
        self.out.flush()

    def close(self) -> None:
        if self.enabled:
            if self._drawn_done != self.done:
                self._draw(time.monotonic())
            if self.tty:
                self.out.write("\n")
            self.out.flush()
