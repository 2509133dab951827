"""Online candidate signals: what is trending, what is watched together, who uploads what.

These feed the service's retrieval (``app.candidates``) and must be shared by
every serving process, so they live in ``feature_store`` with a ``memory``
backend (embedded, snapshotted to the data directory) and a ``redis`` one
beside this file.

**Who updates them**: the signal feed (``app.signal_feed``), a consumer
group (``{namespace}-signals``) run inside each service process, reads the
event log and calls :meth:`CandidateSignals.record` with the users'
histories; the group splits partitions among serving processes, so each
event is recorded once. The trainer does *not* record them (it would count
every event twice); a deployment that prefers it to sets
``api.signal_feed = false``. The service calls
:meth:`CandidateSignals.index_videos` on catalog writes. Readers never write.

Four signals:

- **Trending**: forward-decayed engagement counts. An event of weight ``w`` at
  event time ``t`` adds ``w * 2**((t - landmark) / half_life)``; ranking by
  the sum equals ranking by counts decayed to any common "now", without
  touching every video as time passes. When the exponent grows large the
  scores are rescaled and the landmark moved (one command on Redis).
- **Co-visitation**: each positive engagement of a user pairs the video with
  the user's ``window`` most recent watches (both directions); each video
  keeps its ``neighbors`` strongest partners.
- **Creator uploads**: each creator's newest visible uploads.
- **Category trending**: trending counted within each category (the category
  of a video as :meth:`CandidateSignals.index_videos` last saw it), the
  ``category_videos`` strongest kept per category: what is popular where a
  user's tastes lie, for the categories candidate source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from feature_store.activity.base import HistoryEntry
from feature_store.catalog.base import Video
from feature_store.event_types import MEANINGS, EventType
from feature_store.events import Event

EVENT_WEIGHTS: dict[EventType, float] = {
    kind: m.trending for kind, m in MEANINGS.items() if m.trending
}
"""Trending weight per event type (:attr:`~feature_store.event_types.Meaning.trending`);
impressions, progress beats and negatives count 0."""

T = TypeVar("T")

RESCALE_EXPONENT = 40.0
"""Half-lives past the landmark at which scores are rescaled (2**40 keeps float64 exact enough)."""


@dataclass(frozen=True)
class SignalParams:
    """Tuning of the signals (from ``ApiSettings``)."""

    half_life_s: float = 3600.0
    """Trending half-life, seconds of event time."""
    window: int = 10
    """Recent watches paired with each new positive engagement."""
    neighbors: int = 100
    """Co-visited partners kept per video."""
    creator_videos: int = 50
    """Newest uploads kept per creator."""
    category_videos: int = 200
    """Strongest trending videos kept per category."""
    positive_watch_ratio: float = 0.5
    """A play counts as a positive engagement from this watch ratio
    (``features.positive_watch_ratio``)."""


def is_positive(event: Event, positive_watch_ratio: float) -> bool:
    """An engagement strong enough to say the two videos go together.

    An event of a ``positive`` verdict (:mod:`feature_store.event_types`), or one
    judged by its watch past ``positive_watch_ratio``. A play without a known
    duration counts: co-visitation only needs to know the user went on to watch it.
    """
    verdict = MEANINGS[event.type].verdict
    if verdict == "watch":
        ratio = event.watch_ratio()
        return ratio is None or ratio >= positive_watch_ratio
    return verdict == "positive"


def trending_increments(
    events: Sequence[Event], landmark_ms: int, half_life_s: float
) -> dict[str, float]:
    """Forward-decayed increments per video for a batch (see the module docstring)."""
    out: dict[str, float] = defaultdict(float)
    half_life_ms = half_life_s * 1000.0
    for event in events:
        weight = EVENT_WEIGHTS.get(event.type, 0.0)
        if weight:
            out[event.video_id] += weight * 2.0 ** ((event.ts - landmark_ms) / half_life_ms)
    return out


def covisit_increments(
    events: Sequence[Event],
    histories: Mapping[str, Sequence[HistoryEntry]] | None,
    window: int,
    positive_watch_ratio: float = 0.5,
) -> dict[tuple[str, str], float]:
    """Pair weights ``(a, b) -> w`` from a batch; both directions are included.

    ``histories`` are the users' histories *before* this batch, newest first (their
    positive entries are the recent watches paired); without them only pairs
    within the batch are counted.
    """
    by_user: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if is_positive(event, positive_watch_ratio):
            by_user[event.user_id].append(event)
    pairs: dict[tuple[str, str], float] = defaultdict(float)
    for user_id, user_events in by_user.items():
        in_batch = {e.video_id for e in user_events}
        # A history read after the batch was applied already holds its videos;
        # leaving them out makes both orders of writers count each pair once.
        history = (histories or {}).get(user_id, ())
        prior = [
            h.video_id for h in history if h.positive and h.video_id not in in_batch
        ][:window]
        for event in sorted(user_events, key=lambda e: e.ts):
            video = event.video_id
            for other in prior:
                if other != video:
                    pairs[(video, other)] += 1.0
                    pairs[(other, video)] += 1.0
            if video in prior:
                prior.remove(video)
            prior.insert(0, video)
            del prior[window:]
    return pairs


def interleave(lists: Sequence[Sequence[T]], limit: int) -> list[T]:
    """Round-robin over ``lists`` (the first creator's newest, the second's, ...)."""
    out: list[T] = []
    depth = 0
    while len(out) < limit and any(depth < len(lst) for lst in lists):
        for lst in lists:
            if depth < len(lst):
                out.append(lst[depth])
                if len(out) >= limit:
                    break
        depth += 1
    return out


@runtime_checkable
class CandidateSignals(Protocol):
    """Trending, co-visitation and creator uploads. Backends: ``memory``, ``redis``."""

    def record(
        self,
        events: Sequence[Event],
        histories: Mapping[str, Sequence[HistoryEntry]] | None = None,
    ) -> None:
        """Apply a batch of events (``histories``: users' watches before the batch)."""
        ...

    def index_videos(self, videos: Sequence[Video]) -> None:
        """Note uploads (and hides) for the creator source, and each video's category for
        category trending."""
        ...

    def trending(self, limit: int) -> list[tuple[str, float]]:
        """Top videos by decayed engagement, strongest first, with relative scores."""
        ...

    def covisited(self, video_ids: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """Partners of ``video_ids`` (summed weights), strongest first; one round trip."""
        ...

    def creator_videos(self, creator_ids: Sequence[str], limit: int) -> list[str]:
        """Newest uploads of the creators, interleaved in the order given."""
        ...

    def category_videos(self, categories: Sequence[str], limit: int) -> list[str]:
        """Each category's trending videos, strongest first, interleaved in the order given."""
        ...

    def ping(self) -> None:
        """Raise :class:`~feature_store.errors.StoreUnavailable` if the backend is down."""
        ...

    def snapshot(self, directory: Path) -> None: ...

    def restore(self, directory: Path) -> None: ...

    def close(self) -> None: ...
