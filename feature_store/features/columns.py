"""Declarative feature columns.

A column says *what* to read from a :class:`FeatureRow` and *how* it enters
the model; :mod:`feature_store.features.extract` turns a batch of rows into
keys and index tensors. Four kinds:

- :class:`Categorical`: one value per row (user, video, creator, device...).
  Gets an embedding (deep part) and, when ``wide``, a wide weight.
- :class:`MultiValued`: a list per row (tags, recent history), embedded and
  pooled (mean or sum) over at most ``max_len`` values.
- :class:`Crossed`: a product of categorical columns (user x category), wide
  part only; memorises co-occurrences the deep part generalises over.
- :class:`Dense`: a numeric feature (video age, duration, log popularity),
  computed column-wise by :mod:`feature_store.features.dense`.

Values come from *sources*: named functions of a :class:`FeatureRow`. Naming
them (instead of holding lambdas) keeps the schema serialisable, so its hash
can be stored in every exported model and checked by the server.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext

MISSING = "~"
"""Value of a categorical feature the row does not have (its own key)."""


@dataclass(frozen=True)
class FeatureRow:
    """Everything known about one (user, video) pair at one moment.

    Training builds it from an event plus the user's history and the video's
    counters *before* that event; serving builds it for each candidate at
    request time. Both go through the same columns, so they cannot drift.
    """

    user_id: str
    video_id: str
    ts_ms: int
    """The moment of the event (training) or of the request (serving)."""
    video: Video | None = None
    """Catalog record; ``None`` when the video is not in the catalog."""
    context: EventContext = field(default_factory=EventContext)
    history: tuple[HistoryEntry, ...] = ()
    """The user's recent watches, newest first."""
    stats: VideoStats = field(default_factory=VideoStats)


# --- sources --------------------------------------------------------------


def _hour_bucket(row: FeatureRow) -> str:
    return str((row.ts_ms // 3_600_000) % 24)


def _position_bucket(row: FeatureRow) -> str:
    position = row.context.position
    if position is None:
        return MISSING
    # Exact ranks up to 9, then log2-wide buckets (10-19, 20-39, 40-79, ...).
    return str(position) if position < 10 else f"{10 + int(math.log2(position / 10))}+"


def _duration_bucket(row: FeatureRow) -> str:
    if row.video is None:
        return MISSING
    return str(int(math.log2(row.video.duration_ms / 1000 + 1)))


CATEGORICAL_SOURCES: dict[str, Callable[[FeatureRow], str]] = {
    "user_id": lambda r: r.user_id,
    "video_id": lambda r: r.video_id,
    "creator_id": lambda r: r.video.creator_id if r.video else MISSING,
    "category": lambda r: r.video.category if r.video else MISSING,
    "device": lambda r: r.context.device or MISSING,
    "os": lambda r: r.context.os or MISSING,
    "country": lambda r: r.context.country or MISSING,
    "surface": lambda r: r.context.surface or MISSING,
    "age_group": lambda r: r.context.age_group or MISSING,
    "gender": lambda r: r.context.gender or MISSING,
    "occupation": lambda r: r.context.occupation or MISSING,
    "hour_of_day": _hour_bucket,
    "position_bucket": _position_bucket,
    "duration_bucket": _duration_bucket,
}

MULTI_SOURCES: dict[str, Callable[[FeatureRow], list[str]]] = {
    "tags": lambda r: list(r.video.tags) if r.video else [],
    "history_videos": lambda r: [h.video_id for h in r.history],
}

# --- columns --------------------------------------------------------------


@dataclass(frozen=True)
class Categorical:
    """One value per row; an embedding row and, if ``wide``, a wide weight."""

    name: str
    source: str
    dim: int
    table: str = ""
    """Sparse table of the embedding; defaults to the column's name."""
    key_space: str = ""
    """Hash namespace; columns sharing rows share it. Defaults to ``table``."""
    wide: bool = True

    def table_name(self) -> str:
        return self.table or self.name

    def space(self) -> str:
        return self.key_space or self.table_name()


@dataclass(frozen=True)
class MultiValued:
    """A list per row, embedded and pooled over at most ``max_len`` values."""

    name: str
    source: str
    dim: int
    max_len: int
    pooling: Literal["mean", "sum"] = "mean"
    table: str = ""
    key_space: str = ""

    def table_name(self) -> str:
        return self.table or self.name

    def space(self) -> str:
        return self.key_space or self.table_name()


@dataclass(frozen=True)
class Crossed:
    """Product of categorical columns; a wide weight per combination."""

    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Dense:
    """A numeric feature, already transformed to a small range."""

    name: str
    source: str


Column = Categorical | MultiValued | Crossed | Dense
