"""Dense (numeric) features, computed column-wise with numpy.

The one definition of every dense source: the generic extractor (training)
and the request extractor (serving) both gather the same raw arrays into
:class:`DenseInputs` and call :func:`dense_matrix`, so the formulas cannot
drift between them. Each source is scaled to roughly 0..10 (log of counts
and hours, smoothed rates in 0..1) so the MLP needs no normalisation layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.event_types import COUNTERS
from feature_store.features.sources import SOURCES, Scope, source

if TYPE_CHECKING:
    from feature_store.features.columns import Dense, FeatureRow

Floats = npt.NDArray[np.float64]

STAT_FIELDS = (*COUNTERS, "last_ts")
"""The :class:`VideoStats` fields dense features (and cold start) may read, in
``DenseInputs.stats`` column order: every event type's counter
(:data:`~feature_store.event_types.COUNTERS`) and the latest event's time."""
_stat_row = attrgetter(*STAT_FIELDS)
_S = {name: j for j, name in enumerate(STAT_FIELDS)}

AFFINITY_FIELDS = ("category_engaged", "category_rejected", "creator_engaged", "creator_rejected")
"""Counts behind :attr:`~feature_store.features.sources.Scope.AFFINITY`, the columns of
``DenseInputs.affinity``: the user's positive and negative history entries (of the
entries the model reads) of the candidate's category, then of its creator."""
_A = {name: j for j, name in enumerate(AFFINITY_FIELDS)}

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
    affinity: Floats | None = None
    """(B, len(AFFINITY_FIELDS)) counts (None: no source reads them, or a row cache that
    holds only per-video values)."""

    def stat(self, name: str) -> Floats:
        return self.stats[:, _S[name]]

    def affinities(self, name: str) -> Floats:
        assert self.affinity is not None, "DenseInputs built without the affinity counts"
        return self.affinity[:, _A[name]]

    def field(self, name: str) -> Floats:
        return self.fields[name]


def stats_matrix(stats: Sequence[VideoStats]) -> Floats:
    """(B, len(STAT_FIELDS)) float64 matrix of counters, one C-level pass."""
    flat = chain.from_iterable(map(_stat_row, stats))
    return np.fromiter(flat, np.float64, len(stats) * len(STAT_FIELDS)).reshape(
        len(stats), len(STAT_FIELDS)
    )


def history_counts(
    history: Sequence[HistoryEntry],
) -> tuple[Counter[str], Counter[str], Counter[str], Counter[str]]:
    """Positive and negative entries per category, then per creator (the affinity's counts
    for one history; an entry without a category or creator counts for none)."""
    engaged, rejected = Counter[str](), Counter[str]()
    by_creator, against_creator = Counter[str](), Counter[str]()
    for entry in history:
        if entry.positive:
            engaged[entry.category] += 1
            by_creator[entry.creator_id] += 1
        else:
            rejected[entry.category] += 1
            against_creator[entry.creator_id] += 1
    for counts in (engaged, rejected, by_creator, against_creator):
        counts.pop("", None)
    return engaged, rejected, by_creator, against_creator


def affinity_of_rows(rows: Sequence[FeatureRow]) -> Floats:
    """(B, len(AFFINITY_FIELDS)) affinity counts of each row's video in its user's history
    (counted once per distinct history: the rows of one user in a batch share it)."""
    out = np.zeros((len(rows), len(AFFINITY_FIELDS)))
    counted: dict[int, tuple[Counter[str], ...]] = {}
    for i, row in enumerate(rows):
        if row.video is None or not row.history:
            continue
        counts = counted.get(id(row.history))
        if counts is None:
            counts = counted[id(row.history)] = history_counts(row.history)
        category, creator = row.video.category, row.video.creator_id
        out[i] = (counts[0][category], counts[1][category], counts[2][creator], counts[3][creator])
    return out


def inputs_from_rows(
    rows: Sequence[FeatureRow], fields: Sequence[str], affinity: bool = False
) -> DenseInputs:
    """:class:`DenseInputs` of ``rows`` with the catalog ``fields`` dense sources read (and
    the affinity counts when ``affinity``)."""
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
        affinity=affinity_of_rows(rows) if affinity else None,
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


_AF = (Scope.AFFINITY,)


@source("category_engaged_log", "dense", _AF)
def _category_engaged(x: DenseInputs) -> Floats:
    return np.log1p(x.affinities("category_engaged"))


@source("category_rejected_log", "dense", _AF)
def _category_rejected(x: DenseInputs) -> Floats:
    return np.log1p(x.affinities("category_rejected"))


@source("creator_engaged_log", "dense", _AF)
def _creator_engaged(x: DenseInputs) -> Floats:
    return np.log1p(x.affinities("creator_engaged"))


@source("creator_rejected_log", "dense", _AF)
def _creator_rejected(x: DenseInputs) -> Floats:
    return np.log1p(x.affinities("creator_rejected"))


def reads_affinity(columns: Sequence[Dense]) -> bool:
    """Whether any of ``columns`` reads the affinity counts."""
    return any(Scope.AFFINITY in SOURCES[c.source].reads for c in columns)


def dense_matrix(columns: Sequence[Dense], inputs: DenseInputs) -> npt.NDArray[np.float32]:
    """(B, len(columns)) float32 features, in column order."""
    out = np.empty((len(inputs.ts_ms), len(columns)), dtype=np.float32)
    for j, col in enumerate(columns):
        out[:, j] = SOURCES[col.source].compute(inputs)
    return out
