"""Dense (numeric) features, computed column-wise with numpy.

The one definition of every dense source: the generic extractor (training)
and the request extractor (serving) both gather the same raw arrays into
:class:`DenseInputs` and call :func:`dense_matrix`, so the formulas cannot
drift between them. Each source is scaled to roughly 0..10 (log of counts
and hours, smoothed rates in 0..1) so the MLP needs no normalisation layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import VideoStats
from feature_store.features.sources import SOURCES, Scope, source

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
    """Raw numbers behind the dense features of ``B`` rows (float64 arrays).

    ``fields`` holds exactly the numeric catalog fields the schema's dense
    sources declare (:func:`~feature_store.features.sources.dense_fields`), so
    a source reading an undeclared field fails on its first batch, in tests.
    """

    ts_ms: Floats
    """(B,) moment of each row, ms since epoch."""
    fields: dict[str, Floats]
    """Catalog field -> (B,) values; NaN where the video is not in the catalog."""
    stats: Floats
    """(B, len(STAT_FIELDS)) the video's counters."""
    history_len: Floats
    """(B,) entries in the user's history."""

    def stat(self, name: str) -> Floats:
        return self.stats[:, _S[name]]

    def field(self, name: str) -> Floats:
        return self.fields[name]


def stats_matrix(stats: Sequence[VideoStats]) -> Floats:
    """(B, len(STAT_FIELDS)) float64 matrix of counters, one C-level pass."""
    flat = chain.from_iterable(map(_stat_row, stats))
    return np.fromiter(flat, np.float64, len(stats) * len(STAT_FIELDS)).reshape(
        len(stats), len(STAT_FIELDS)
    )


def inputs_from_rows(rows: Sequence[FeatureRow], fields: Sequence[str]) -> DenseInputs:
    """:class:`DenseInputs` of ``rows`` with the catalog ``fields`` dense sources read."""
    nan = float("nan")
    n = len(rows)
    return DenseInputs(
        ts_ms=np.fromiter((r.ts_ms for r in rows), np.float64, n),
        fields={
            name: np.fromiter(
                (getattr(r.video, name) if r.video else nan for r in rows), np.float64, n
            )
            for name in fields
        },
        stats=stats_matrix([r.stats for r in rows]),
        history_len=np.fromiter((len(r.history) for r in rows), np.float64, n),
    )


def _log_hours_since(ms: Floats, now_ms: Floats) -> Floats:
    return np.log1p(np.maximum(0.0, (now_ms - ms) / 3_600_000))


_ST = (Scope.VIDEO_STATS,)


@source("video_age_log_hours", "dense", (Scope.VIDEO, Scope.REQUEST), fields=("uploaded_at",))
def _video_age(x: DenseInputs) -> Floats:
    return np.nan_to_num(_log_hours_since(x.field("uploaded_at"), x.ts_ms), nan=0.0)


@source("duration_log_s", "dense", (Scope.VIDEO,), fields=("duration_ms",))
def _duration(x: DenseInputs) -> Floats:
    return np.nan_to_num(np.log1p(x.field("duration_ms") / 1000), nan=0.0)


@source("log_engagements", "dense", _ST)
def _engagements(x: DenseInputs) -> Floats:
    return np.log1p(x.stat("plays") + x.stat("finishes") + x.stat("likes") + x.stat("shares"))


@source("log_impressions", "dense", _ST)
def _impressions(x: DenseInputs) -> Floats:
    return np.log1p(x.stat("impressions"))


@source("finish_rate", "dense", _ST)
def _finish_rate(x: DenseInputs) -> Floats:
    return (x.stat("finishes") + 0.5) / (x.stat("plays") + 1.0)


@source("like_rate", "dense", _ST)
def _like_rate(x: DenseInputs) -> Floats:
    return (x.stat("likes") + x.stat("shares") + 0.1) / (x.stat("plays") + 1.0)


@source("skip_rate", "dense", _ST)
def _skip_rate(x: DenseInputs) -> Floats:
    return (x.stat("skips") + x.stat("dislikes") + 0.1) / (
        x.stat("impressions") + x.stat("plays") + 1.0
    )


@source("history_length_log", "dense", (Scope.USER,))
def _history_length(x: DenseInputs) -> Floats:
    return np.log1p(x.history_len)


@source("recency_log_hours", "dense", (Scope.VIDEO_STATS, Scope.REQUEST))
def _recency(x: DenseInputs) -> Floats:
    last = x.stat("last_ts")
    return np.where(last > 0, _log_hours_since(last, x.ts_ms), NEVER_SEEN_RECENCY)


def dense_matrix(columns: Sequence[Dense], inputs: DenseInputs) -> npt.NDArray[np.float32]:
    """(B, len(columns)) float32 features, in column order."""
    out = np.empty((len(inputs.ts_ms), len(columns)), dtype=np.float32)
    for j, col in enumerate(columns):
        out[:, j] = SOURCES[col.source].compute(inputs)
    return out
