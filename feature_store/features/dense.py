"""Dense (numeric) features, computed column-wise with numpy.

The one definition of every dense source: the generic extractor (training)
and the request extractor (serving) both gather the same raw arrays into
:class:`DenseInputs` and call :func:`dense_matrix`, so the formulas cannot
drift between them. Each source is scaled to roughly 0..10 (log of counts
and hours, smoothed rates in 0..1) so the MLP needs no normalisation layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import VideoStats

if TYPE_CHECKING:
    from feature_store.features.columns import Dense, FeatureRow

Floats = npt.NDArray[np.float64]

STAT_FIELDS = (
    "impressions", "plays", "finishes", "likes", "shares", "skips", "dislikes", "last_ts",
)
"""The :class:`VideoStats` fields dense features read, in ``DenseInputs.stats`` column order."""
_stat_row = attrgetter(*STAT_FIELDS)
_S = {name: j for j, name in enumerate(STAT_FIELDS)}

NEVER_SEEN_RECENCY = 10.0
"""``recency_log_hours`` of a video without events (about 2.5 years in log-hours)."""


@dataclass(frozen=True)
class DenseInputs:
    """Raw numbers behind the dense features of ``B`` rows (float64 arrays)."""

    ts_ms: Floats
    """(B,) moment of each row, ms since epoch."""
    uploaded_at: Floats
    """(B,) upload time, ms; NaN where the video is not in the catalog."""
    duration_ms: Floats
    """(B,) video length, ms; NaN where the video is not in the catalog."""
    stats: Floats
    """(B, len(STAT_FIELDS)) the video's counters."""
    history_len: Floats
    """(B,) entries in the user's history."""

    def stat(self, name: str) -> Floats:
        return self.stats[:, _S[name]]


def stats_matrix(stats: Sequence[VideoStats]) -> Floats:
    """(B, len(STAT_FIELDS)) float64 matrix of counters, one C-level pass."""
    flat = chain.from_iterable(map(_stat_row, stats))
    return np.fromiter(flat, np.float64, len(stats) * len(STAT_FIELDS)).reshape(
        len(stats), len(STAT_FIELDS)
    )


def inputs_from_rows(rows: Sequence[FeatureRow]) -> DenseInputs:
    nan = float("nan")
    return DenseInputs(
        ts_ms=np.fromiter((r.ts_ms for r in rows), np.float64, len(rows)),
        uploaded_at=np.fromiter(
            (r.video.uploaded_at if r.video else nan for r in rows), np.float64, len(rows)
        ),
        duration_ms=np.fromiter(
            (r.video.duration_ms if r.video else nan for r in rows), np.float64, len(rows)
        ),
        stats=stats_matrix([r.stats for r in rows]),
        history_len=np.fromiter((len(r.history) for r in rows), np.float64, len(rows)),
    )


def _log_hours_since(ms: Floats, now_ms: Floats) -> Floats:
    return np.log1p(np.maximum(0.0, (now_ms - ms) / 3_600_000))


def _video_age(x: DenseInputs) -> Floats:
    return np.nan_to_num(_log_hours_since(x.uploaded_at, x.ts_ms), nan=0.0)


def _duration(x: DenseInputs) -> Floats:
    return np.nan_to_num(np.log1p(x.duration_ms / 1000), nan=0.0)


def _engagements(x: DenseInputs) -> Floats:
    return np.log1p(x.stat("plays") + x.stat("finishes") + x.stat("likes") + x.stat("shares"))


def _recency(x: DenseInputs) -> Floats:
    last = x.stat("last_ts")
    return np.where(last > 0, _log_hours_since(last, x.ts_ms), NEVER_SEEN_RECENCY)


DENSE_SOURCES: dict[str, Callable[[DenseInputs], Floats]] = {
    "video_age_log_hours": _video_age,
    "duration_log_s": _duration,
    "log_engagements": _engagements,
    "log_impressions": lambda x: np.log1p(x.stat("impressions")),
    "finish_rate": lambda x: (x.stat("finishes") + 0.5) / (x.stat("plays") + 1.0),
    "like_rate": lambda x: (x.stat("likes") + x.stat("shares") + 0.1) / (x.stat("plays") + 1.0),
    "skip_rate": lambda x: (x.stat("skips") + x.stat("dislikes") + 0.1)
    / (x.stat("impressions") + x.stat("plays") + 1.0),
    "history_length_log": lambda x: np.log1p(x.history_len),
    "recency_log_hours": _recency,
}
"""Every dense source by name; a schema's :class:`Dense` columns refer to these."""


def dense_matrix(columns: Sequence[Dense], inputs: DenseInputs) -> npt.NDArray[np.float32]:
    """(B, len(columns)) float32 features, in column order."""
    out = np.empty((len(inputs.ts_ms), len(columns)), dtype=np.float32)
    for j, col in enumerate(columns):
        out[:, j] = DENSE_SOURCES[col.source](inputs)
    return out
