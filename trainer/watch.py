"""The ``watch`` head's target: a play's watch ratio ranked within its duration bucket.

Raw watch time favours long videos (a 40 min film watched for 5 minutes
beats a 30 s clip watched twice), and the raw watch ratio favours short
ones (a 10 s clip is usually watched whole). Ranking the ratio among plays
of videos of similar length removes most of that duration bias: the target
says "watched more than most plays of videos this long".

The target of a play of watch ratio ``r`` (capped at 1) in bucket ``b`` is
its **mid-rank quantile** among the plays of ``b`` seen *before* it::

    q = (plays of b with a lower ratio + 0.5 * plays in r's bin) / plays of b

in [0, 1], from a histogram of ``BINS`` ratio bins per bucket. Each bucket
starts with one pseudo-play per bin (a uniform prior), so a bucket's first
plays get ``q ~ r`` and the estimate moves to the data as plays arrive; a
bucket holding ``memory`` plays has its counts halved, so the state stays
bounded and the target follows drift. The estimate is streaming (each play
is ranked, then counted) and checkpointed with the trainer
(:meth:`WatchQuantiles.state`).

Learned as a soft binary target: the head's logit is trained with binary
cross-entropy against ``q``, so its sigmoid estimates the expected quantile
(a calibrated regression in [0, 1] with the same loss scale as the binary
heads).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

BINS = 50
"""Ratio bins per duration bucket (0.02 wide): a finer quantile than any client's
watch reporting gives, in 50 counts per bucket."""


class WatchQuantiles:
    """Per duration bucket, a histogram of watch ratios; ranks a play, then counts it."""

    def __init__(self, bucket_edges_s: Sequence[float], memory: int) -> None:
        self.edges_ms = [int(e * 1000) for e in bucket_edges_s]
        self.memory = memory
        self.counts = np.ones((len(self.edges_ms) + 1, BINS), dtype=np.float64)
        """Plays per (bucket, ratio bin), the uniform prior included."""

    def bucket(self, duration_ms: int) -> int:
        return bisect.bisect_left(self.edges_ms, duration_ms)

    def target(self, ratio: float, duration_ms: int) -> float:
        """The play's quantile among its bucket's earlier plays; then the play is counted."""
        row = self.counts[self.bucket(duration_ms)]
        b = min(BINS - 1, max(0, int(ratio * BINS)))
        total = row.sum()
        q = (row[:b].sum() + 0.5 * row[b]) / total
        row[b] += 1.0
        if total + 1.0 >= self.memory:
            row *= 0.5
        return float(q)

    def state(self) -> dict[str, Any]:
        """JSON-able counts (for the trainer's checkpoint)."""
        return {"edges_ms": self.edges_ms, "counts": self.counts.tolist()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`; counts kept under other bucket edges are not restored
        (they rank against other videos), and the prior starts again."""
        if state.get("edges_ms") != self.edges_ms:
            return
        counts = np.asarray(state.get("counts", []), dtype=np.float64)
        if counts.shape == self.counts.shape:
            self.counts = counts
