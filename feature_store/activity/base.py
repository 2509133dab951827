"""What users did recently and how each video is doing, kept current from events.

Per user: the last N videos the user acted on (watched, finished, liked,
shared, skipped, disliked), newest first, feeding the sequence and history
features and the co-visitation and creator candidate sources. Per video:
counters of each event type and total watch time, feeding the popularity
features and trending.

Two copies, each with one writer per user: serving's, written by the signal
feed (``app/signal_feed.py``) and read by the service; and the trainer's own,
which its point-in-time features read (``Resources.training_activity``).
Each user's events live in one event-log partition, so one consumer of each
group owns each user's history and there is no concurrent read-modify-write
of one history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from feature_store.catalog.base import Video
from feature_store.errors import ConfigurationError
from feature_store.event_types import CHOSEN_COUNTERS, COUNTERS, MEANINGS
from feature_store.events import Event

POSITIVE_ACTIONS = frozenset(
    {"play"} | {kind.value for kind, m in MEANINGS.items() if m.verdict == "positive"}
)
"""History actions that mean the user valued the video (``play``, a watch past the
positive ratio, and the actions of the positive event types: ``finish``, ``like``,
``share``; :mod:`feature_store.event_types`, :mod:`feature_store.activity.rules`)."""


class HistoryEntry(BaseModel):
    """One video in a user's recent history: what they did with it, and when."""

    model_config = ConfigDict(frozen=True)

    video_id: str
    watch_ratio: float
    """Best fraction of the video watched (0..1); 1.0 for finishes, likes and shares."""
    ts: int
    """Time of the latest event that touched this entry, ms since epoch."""
    action: str = "play"
    """The strongest action taken on the video: ``play`` (watched past
    ``features.positive_watch_ratio``), ``finish``, ``like``, ``share`` (positive:
    :data:`POSITIVE_ACTIONS`), ``skip``, ``short`` (a play that ended below
    ``features.short_watch_ratio``) or ``dislike`` (negative)."""
    creator_id: str = ""
    """The video's creator when the entry was written ("" when the catalog did not know it)."""
    category: str = ""
    """The video's category when the entry was written ("" when unknown)."""

    @property
    def positive(self) -> bool:
        """The user valued the video (a watch, finish, like or share)."""
        return self.action in POSITIVE_ACTIONS


VISIT_ACTIONS = POSITIVE_ACTIONS | {"short"}
"""History actions that mean the user watched the video at all: the positive ones and a
``short`` play (a click that did not hold them). Co-visitation counts visits, not
approval: on ml-100k's leave-one-out, pairing visits instead of positives alone lifts
the co-visitation term's HR@10 from 0.51 to 0.59 (``docs/retrieval.md``)."""


def visited(history: Iterable[HistoryEntry]) -> list[HistoryEntry]:
    """The entries of ``history`` the user watched at all (:data:`VISIT_ACTIONS`), in its
    order: co-visitation's seeds."""
    return [entry for entry in history if entry.action in VISIT_ACTIONS]


def watched(history: Iterable[HistoryEntry]) -> list[HistoryEntry]:
    """The positive entries of ``history``, in its order (what "watched" means)."""
    return [entry for entry in history if entry.action in POSITIVE_ACTIONS]


class VideoStats(BaseModel):
    """Lifetime counters of one video."""

    model_config = ConfigDict(frozen=True)

    impressions: int = 0
    clicks: int = 0
    plays: int = 0
    finishes: int = 0
    likes: int = 0
    shares: int = 0
    skips: int = 0
    dislikes: int = 0
    watch_ms: int = 0
    """Sum of watch time over play and finish events, ms."""
    last_ts: int = 0
    """Time of the latest event, ms since epoch (0: never seen)."""

    @property
    def engagements(self) -> int:
        """Counts of chosen events (plays, finishes, likes, shares:
        :data:`~feature_store.event_types.CHOSEN_COUNTERS`): the popularity numerator."""
        return sum(getattr(self, counter) for counter in CHOSEN_COUNTERS)


_UNDECLARED = {counter for counter in COUNTERS if counter not in VideoStats.model_fields}
if _UNDECLARED:  # a new event type's counter needs its field above
    raise ConfigurationError(f"event counters {sorted(_UNDECLARED)} are not VideoStats fields")

NO_STATS = VideoStats()
"""The counters of a video without events. Shared (the model is frozen), so a
reader comparing by identity, like the serving feature cache, sees no change."""


@runtime_checkable
class ActivityStore(Protocol):
    """Per-user history and per-video counters. Backends: ``memory``, ``redis``."""

    def record(
        self, events: Sequence[Event], videos: Mapping[str, Video | None] | None = None
    ) -> None:
        """Apply a batch of events; ``videos`` (the catalog records of the batch's videos)
        fill in unknown video lengths and the creator and category of history entries."""
        ...

    def history(self, user_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """Newest first; empty for an unknown user."""
        ...

    def histories(self, user_ids: Sequence[str]) -> list[list[HistoryEntry]]:
        """Several users' histories in one round trip, in the order asked."""
        ...

    def video_stats(self, video_ids: Sequence[str]) -> list[VideoStats]:
        """Counters in the order asked; zeros for unknown videos; one round trip."""
        ...

    def video_stats_matrix(self, video_ids: Sequence[str]) -> npt.NDArray[np.float64]:
        """:meth:`video_stats` as a ``(len(video_ids), len(STAT_FIELDS))`` matrix
        (:data:`~feature_store.features.dense.STAT_FIELDS` columns): serving's read of a
        request's 500 candidates, without an object per video."""
        ...

    def snapshot(self, directory: Path) -> None: ...

    def restore(self, directory: Path) -> None: ...

    def close(self) -> None: ...
