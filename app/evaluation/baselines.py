"""Popularity baselines, scored test-then-train on the trainer's own samples.

:class:`Popularity` keeps, per video, its positives and its samples, either
plain counts (global popularity) or exponentially decayed ones with a
half-life in event time (recent popularity). Its probability is the smoothed
positive rate ``(pos + m * p) / (n + m)``, with ``p`` the stream's positive
rate so far and ``m`` the prior strength, read *before* the sample is
counted, so it is prequential like the online model. Its ranking is by
positives (decayed or not): "what most people liked (lately)".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from app.evaluation.metrics import Floats


class Popularity:
    """Smoothed positive rate per video, optionally decayed; see the module doc."""

    def __init__(self, half_life_ms: float | None = None, prior_strength: float = 10.0) -> None:
        self.rate = math.log(2) / half_life_ms if half_life_ms else 0.0
        self.prior = prior_strength
        self.pos: dict[str, float] = {}
        self.n: dict[str, float] = {}
        self.seen_at: dict[str, int] = {}
        self.total_pos = 0.0
        self.total = 0.0

    def _decayed(self, video: str, ts: int) -> tuple[float, float]:
        pos, n = self.pos.get(video, 0.0), self.n.get(video, 0.0)
        if self.rate and n:
            f = math.exp(-self.rate * max(0, ts - self.seen_at[video]))
            pos, n = pos * f, n * f
        return pos, n

    def score(self, video: str, ts: int) -> float:
        prior = (self.total_pos + 1.0) / (self.total + 2.0)
        pos, n = self._decayed(video, ts)
        return (pos + self.prior * prior) / (n + self.prior)

    def update(self, video: str, ts: int, label: float) -> None:
        pos, n = self._decayed(video, ts)
        self.pos[video], self.n[video], self.seen_at[video] = pos + label, n + 1.0, ts
        self.total_pos += label
        self.total += 1.0

    def top(self, k: int, ts: int, exclude: Collection[str]) -> list[str]:
        """The ``k`` videos with the most (decayed) positives at ``ts``, minus ``exclude``."""
        videos = list(self.pos)
        if not videos:
            return []
        weight = np.fromiter((self.pos[v] for v in videos), np.float64, len(videos))
        if self.rate:
            age = np.fromiter((ts - self.seen_at[v] for v in videos), np.float64, len(videos))
            weight = weight * np.exp(-self.rate * np.maximum(age, 0.0))
        order = np.argsort(-weight, kind="stable")
        out: list[str] = []
        for i in order.tolist():
            if videos[i] not in exclude:
                out.append(videos[i])
                if len(out) == k:
                    break
        return out


def prequential(
    model: Popularity,
    video_ids: Sequence[str],
    ts_ms: Sequence[int],
    labels: Floats,
    stops: dict[int, list[int]] | None = None,
    on_stop: object = None,
) -> Floats:
    """Score each sample before counting it; ``stops`` maps a sample index to query ids."""
    scores = np.empty(len(video_ids))
    for i, (video, ts, label) in enumerate(zip(video_ids, ts_ms, labels, strict=True)):
        if stops and i in stops and callable(on_stop):
            for query in stops[i]:
                on_stop(query)
        scores[i] = model.score(video, int(ts))
        model.update(video, int(ts), float(label))
    if stops and callable(on_stop):
        for query in stops.get(len(video_ids), []):
            on_stop(query)
    return scores
