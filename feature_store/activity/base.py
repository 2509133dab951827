"""What users did recently and how each video is doing, kept current from events.

Per user: the last N videos watched with their watch ratio (newest first),
feeding the history feature and the co-visitation and creator candidate
sources. Per video: counters of each event type and total watch time, feeding
the popularity features and trending.

Two copies, each with one writer per user: serving's, written by the signal
feed (``app/signal_feed.py``) and read by the service; and the trainer's own,
which its point-in-time features read (``Resources.training_activity``).
Each user's events live in one event-log partition, so one consumer of each
group owns each user's history and there is no concurrent read-modify-write
of one history.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from feature_store.events import Event


class HistoryEntry(BaseModel):
    """One watched video in a user's recent history."""

    model_config = ConfigDict(frozen=True)

    video_id: str
    watch_ratio: float
    """Best fraction of the video watched (0..1); 1.0 for likes and shares."""
    ts: int
    """Time of the latest event that touched this entry, ms since epoch."""


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
        """Plays plus stronger positive signals: the popularity numerator."""
        return self.plays + self.finishes + self.likes + self.shares


NO_STATS = VideoStats()
"""The counters of a video without events. Shared (the model is frozen), so a
reader comparing by identity, like the serving feature cache, sees no change."""


@runtime_checkable
class ActivityStore(Protocol):
    """Per-user history and per-video counters. Backends: ``memory``, ``redis``."""

    def record(self, events: Sequence[Event], durations_ms: dict[str, int] | None = None) -> None:
        """Apply a batch of events; ``durations_ms`` fills in unknown video lengths."""
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

    def snapshot(self, directory: Path) -> None: ...

    def restore(self, directory: Path) -> None: ...

    def close(self) -> None: ...
