"""Per-user feedback that reranking reads: what was served and ignored, what was disliked.

Two signals per user, shared by every serving process (a ``memory`` backend
for the embedded process and tests, a ``redis`` one beside this file):

- **Served without engagement**: the videos the service served the user
  (its served records: :meth:`UserFeedback.record_served`, called by the
  served-log writer off the request path), each with the time it was
  served; an engagement with the video (click, play, progress, finish, like,
  share: :data:`ENGAGEMENTS`) removes it (:meth:`UserFeedback.record_events`,
  called by the signal feed). Entries older than ``served_window_ms`` (of
  the served time) are not returned and are dropped at the next write;
  at most ``served_max`` per user, newest kept.
- **Dislikes**: each disliked video with its time, and the creator of each
  with the time of the latest dislike of one of theirs, at most
  ``dislikes_max`` of each per user, newest kept; kept ``dislikes_ttl_ms``
  after the user's latest dislike. A later *positive* engagement with
  another video of a disliked creator (a finish, like or share, or a play
  reaching ``positive_watch_ratio``: :func:`creator_changes`) takes the
  creator off the list: the user showed they still want that creator, so
  the demotion would only hide what they watch. The disliked video itself
  stays disliked.

A skip is no engagement (the served video stays excluded) and no dislike.
Dislikes are the events of type ``dislike`` (:data:`DISLIKE`).
The reader (:mod:`app.rerank`) also drops a served entry when the user's
history holds the video at or after the served time, so an engagement that
the signal feed recorded before the served record arrived still counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from feature_store.event_types import EventType, of_types
from feature_store.events import Event
from feature_store.signals.base import is_positive

ENGAGEMENTS = of_types("engaged")
"""Event types that clear a served-without-engagement entry: the engaged ones
(:attr:`~feature_store.event_types.Meaning.engaged`)."""


@dataclass(frozen=True)
class FeedbackParams:
    """Bounds of the feedback signals (from ``RerankSettings``)."""

    served_window_ms: int = 3600 * 1000
    """How long a served entry counts, ms of the served time."""
    served_max: int = 500
    """Served entries kept per user."""
    dislikes_max: int = 1000
    """Disliked videos (and, apart, creators) kept per user."""
    dislikes_ttl_ms: int = 365 * 24 * 3600 * 1000
    """How long a user's dislikes live after their latest one, ms."""
    positive_watch_ratio: float = 0.5
    """A play from this watch ratio is a positive engagement (``features.positive_watch_ratio``)."""


class ServedBatch(NamedTuple):
    """What one response served: the user, when (ms), and the videos, best first."""

    user_id: str
    ts_ms: int
    video_ids: Sequence[str]


@dataclass(frozen=True)
class FeedbackView:
    """One user's feedback as of a moment (:meth:`UserFeedback.read`)."""

    served: dict[str, int] = field(default_factory=dict)
    """Video -> when it was last served (ms), within the window, not engaged since."""
    disliked: dict[str, int] = field(default_factory=dict)
    """Video -> when the user disliked it (ms)."""
    disliked_creators: dict[str, int] = field(default_factory=dict)
    """Creator -> when the user last disliked one of their videos (ms)."""


EMPTY_VIEW = FeedbackView()

DISLIKE = EventType.DISLIKE
"""The event type noted as a dislike (the one negative the reranker demotes by)."""


def needs_creator(event: Event, positive_watch_ratio: float) -> bool:
    """Whether :meth:`UserFeedback.record_events` needs the creator of ``event``'s video."""
    return event.type is DISLIKE or is_positive(event, positive_watch_ratio)


def creator_changes(
    events: Sequence[Event], creators: Mapping[str, str], positive_watch_ratio: float
) -> tuple[dict[str, dict[str, int]], dict[str, set[str]]]:
    """Per user, the creators a batch dislikes (with the latest time) and those it takes
    off the list (a positive engagement after any dislike of theirs in the batch), in
    event-time order, so a pair ends in at most one of the two."""
    disliked: dict[str, dict[str, int]] = defaultdict(dict)
    cleared: dict[str, set[str]] = defaultdict(set)
    for event in sorted(events, key=lambda e: e.ts):
        creator = creators.get(event.video_id)
        if creator is None:
            continue
        user = event.user_id
        if event.type is DISLIKE:
            disliked[user][creator] = event.ts
            cleared[user].discard(creator)
        elif is_positive(event, positive_watch_ratio):
            disliked[user].pop(creator, None)
            cleared[user].add(creator)
    return {u: d for u, d in disliked.items() if d}, {u: c for u, c in cleared.items() if c}


@runtime_checkable
class UserFeedback(Protocol):
    """Served-without-engagement and dislikes per user. Backends: ``memory``, ``redis``."""

    def record_served(self, batches: Sequence[ServedBatch]) -> None:
        """Note what responses served (each video's served time becomes the batch's)."""
        ...

    def record_events(self, events: Sequence[Event], creators: Mapping[str, str]) -> None:
        """Apply engagements and dislikes; ``creators`` maps the videos of dislikes and of
        positive engagements (:func:`needs_creator`) to their creators."""
        ...

    def read(self, user_id: str, now_ms: int) -> FeedbackView:
        """The user's feedback at ``now_ms`` (served entries within the window); one round
        trip."""
        ...

    def ping(self) -> None:
        """Raise :class:`~feature_store.errors.StoreUnavailable` if the backend is down."""
        ...

    def snapshot(self, directory: Path) -> None: ...

    def restore(self, directory: Path) -> None: ...

    def close(self) -> None: ...
