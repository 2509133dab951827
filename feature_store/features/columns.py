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

And one block over columns, :class:`Attention`: the candidate's own columns
(video, creator, category) attend over the user's recent actions (the
aligned multi-valued columns ``seq_*``, pooling ``attention``), so what the
user just did with videos *like this one* reaches the score without anyone
retraining a row (see ``trainer/model.py``).

Values come from *sources*: named, declared functions
(:mod:`feature_store.features.sources`; the categorical and multi-valued ones
of a :class:`FeatureRow` are below, the dense ones in
:mod:`feature_store.features.dense`). Naming them (instead of holding
lambdas) keeps the schema serialisable, so its hash can be stored in every
exported model and checked by the server.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features.sources import Scope, source

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


# --- sources (declared in feature_store.features.sources) -----------------

_R, _U, _V = (Scope.REQUEST,), (Scope.USER,), (Scope.VIDEO,)


@source("user_id", "categorical", _R)
def _user_id(row: FeatureRow) -> str:
    return row.user_id


@source("video_id", "categorical", _V, fields=("video_id",))
def _video_id(row: FeatureRow) -> str:
    return row.video_id


@source("creator_id", "categorical", _V, fields=("creator_id",))
def _creator_id(row: FeatureRow) -> str:
    return row.video.creator_id if row.video else MISSING


@source("category", "categorical", _V, fields=("category",))
def _category(row: FeatureRow) -> str:
    return row.video.category if row.video else MISSING


def _context_source(name: str) -> None:
    """A categorical source reading one optional field of the event or request context."""

    def value(row: FeatureRow) -> str:
        return getattr(row.context, name) or MISSING

    source(name, "categorical", _R)(value)


for _field in ("device", "os", "country", "surface", "age_group", "gender", "occupation"):
    _context_source(_field)


@source("hour_of_day", "categorical", _R)
def _hour_bucket(row: FeatureRow) -> str:
    return str((row.ts_ms // 3_600_000) % 24)


@source("position_bucket", "categorical", _R)
def _position_bucket(row: FeatureRow) -> str:
    position = row.context.position
    if position is None:
        return MISSING
    # Exact ranks up to 9, then log2-wide buckets (10-19, 20-39, 40-79, ...).
    return str(position) if position < 10 else f"{10 + int(math.log2(position / 10))}+"


@source("duration_bucket", "categorical", _V, fields=("duration_ms",))
def _duration_bucket(row: FeatureRow) -> str:
    if row.video is None:
        return MISSING
    return str(int(math.log2(row.video.duration_ms / 1000 + 1)))


@source("tags", "multi", _V, fields=("tags",))
def _tags(row: FeatureRow) -> list[str]:
    return list(row.video.tags) if row.video else []


TEXT_WORD = re.compile(r"[^\W_]+")
"""A word of a title or description: letters and digits, any script."""
DESCRIPTION_WORDS = 20
"""Words of a description that count (its beginning says what the video is)."""


def text_tokens(title: str, description: str = "") -> list[str]:
    """A video's text as tokens, most telling first, each once: the title's words, the
    title's pairs of adjacent words (``star_wars``), the description's first words.
    Lower-cased; hashing makes any vocabulary a key space of its own."""
    words = TEXT_WORD.findall(title.lower())
    pairs = [f"{a}_{b}" for a, b in zip(words, words[1:], strict=False)]
    described = TEXT_WORD.findall(description.lower())[:DESCRIPTION_WORDS]
    return list(dict.fromkeys([*words, *pairs, *described]))


@source("title_tokens", "multi", _V, fields=("title", "description"))
def _title_tokens(row: FeatureRow) -> list[str]:
    return text_tokens(row.video.title, row.video.description) if row.video else []


@source("history_videos", "multi", _U)
def _history_videos(row: FeatureRow) -> list[str]:
    """The videos the user valued (positive entries), newest first."""
    return [h.video_id for h in row.history if h.positive]


# The user's recent actions, one position per history entry, positive or negative:
# four aligned lists (a missing creator or category keeps its position as MISSING).


@source("recent_videos", "multi", _U)
def _recent_videos(row: FeatureRow) -> list[str]:
    return [h.video_id for h in row.history]


@source("recent_creators", "multi", _U)
def _recent_creators(row: FeatureRow) -> list[str]:
    return [h.creator_id or MISSING for h in row.history]


@source("recent_categories", "multi", _U)
def _recent_categories(row: FeatureRow) -> list[str]:
    return [h.category or MISSING for h in row.history]


def age_bucket(age_ms: int) -> int:
    """How long ago, in log2 steps of 10 s: 0 under 10 s, 1 under 30 s, 2 under 70 s,
    ... 13 from about a day (a negative age, a clock skew, is 0)."""
    return min(13, int(math.log2(1 + max(0, age_ms) / 10_000)))


@source("recent_actions", "multi", (Scope.REQUEST, Scope.USER))
def _recent_actions(row: FeatureRow) -> list[str]:
    """What the user did and how long before this moment: ``like:3``, ``skip:0``..."""
    now = row.ts_ms
    return [f"{h.action}:{age_bucket(now - h.ts)}" for h in row.history]


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
    pooling: Literal["mean", "sum", "attention"] = "mean"
    """``attention``: not pooled on its own; read position by position by an
    :class:`Attention` block (the request's one list, not repeated per candidate)."""
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


@dataclass(frozen=True)
class Attention:
    """Target attention of the candidate over the user's recent actions (DIN-style).

    ``keys`` are multi-valued columns with ``pooling="attention"`` and one
    ``max_len``, aligned position by position (one history entry each);
    ``queries`` are the candidate's categorical columns in the same embedding
    tables, in the same order (``seq_video`` with ``video``...), so a
    position's key and the candidate's query are rows of one space;
    ``extras`` (the action and its age) describe each position without a
    query. Each of ``heads`` heads projects to ``width // heads`` and weighs
    a position by the sigmoid of its scaled dot product with the candidate;
    the block's output is, per head, the weighted mean of the positions'
    concatenated rows (keys and extras), so a user who skipped three videos of
    a category yields another vector for a candidate of it than one who liked
    them, and one who did nothing yields zeros.
    """

    name: str
    keys: tuple[str, ...]
    queries: tuple[str, ...]
    extras: tuple[str, ...] = ()
    width: int = 32
    heads: int = 2


@dataclass(frozen=True)
class Dot:
    """The inner product of two embedded columns' rows (one categorical or pooled
    multi-valued row each, of one width), added to the engagement logit with a learnt
    scale: a factorisation term (the user's row against the video's, the pooled history
    against the video's) that an MLP over concatenated rows learns only slowly."""

    name: str
    columns: tuple[str, str]
    initial_scale: float = 1.0
    """The learnt scale's starting value: below 1 for a term that is noise until its rows
    have trained (a large early dot makes the first predictions overconfident)."""


Column = Categorical | MultiValued | Crossed | Dense | Attention | Dot
