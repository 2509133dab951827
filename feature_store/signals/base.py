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
- **Co-visitation**: each new visit of a user (a play of any length or a
  positive engagement, :func:`covisit_increments`) pairs the video with the
  user's ``window`` most recent visits (both directions) and counts toward the
  video's visits; each video keeps its ``neighbors`` strongest partners. Read
  as a cosine (:func:`cosine_scores`): the pair counts over the square roots of
  both videos' visits, summed over the user's recent visits with weights
  decaying by position.
- **Creator uploads**: each creator's newest visible uploads.
- **Category trending**: trending counted within each category (the category
  of a video as :meth:`CandidateSignals.index_videos` last saw it), the
  ``category_videos`` strongest kept per category: what is popular where a
  user's tastes lie, for the categories candidate source.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from feature_store.activity.base import HistoryEntry, visited
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
    """Recent visits paired with each new visit."""
    neighbors: int = 200
    """Co-visited partners kept per video (the strongest counts)."""
    decay: float = 0.8
    """Weight of a user's recent visit per position back in :func:`cosine_scores`."""
    creator_videos: int = 50
    """Newest uploads kept per creator."""
    category_videos: int = 200
    """Strongest trending videos kept per category."""


def is_positive(event: Event, positive_watch_ratio: float) -> bool:
    """An engagement strong enough to say the user valued the video (the feedback
    signals, :mod:`feature_store.signals.feedback`).

    An event of a ``positive`` verdict (:mod:`feature_store.event_types`), or one
    judged by its watch past ``positive_watch_ratio``. A play without a known
    duration counts.
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


def is_visit(event: Event) -> bool:
    """The user watched the video at all: a ``play`` of any length or a positive
    engagement (not an impression, a skip or a dislike)."""
    return MEANINGS[event.type].verdict in ("positive", "watch")


@dataclass(frozen=True)
class CovisitIncrements:
    """What a batch adds to co-visitation."""

    pairs: dict[tuple[str, str], float]
    """``(a, b) -> count`` of new visits paired, both directions."""
    visits: dict[str, float]
    """New visits per video: the cosine's denominators (:func:`cosine_scores`)."""


def covisit_increments(
    events: Sequence[Event],
    histories: Mapping[str, Sequence[HistoryEntry]] | None,
    window: int,
) -> CovisitIncrements:
    """The pairs and visits of a batch.

    A *new visit* is a visit (:func:`is_visit`) of a video that is not among the
    user's ``window`` most recent visits: it counts once toward the video's visits
    and pairs with each of those recent visits. A ``finish`` or ``like`` after the
    ``play`` of the same view is not a new visit, so a view counts once however many
    events it sends.

    ``histories`` are the users' histories, newest first, read before or after this
    batch was applied: an entry of a video of the batch whose time is not older than
    the user's first event on it in the batch was written by the batch and is left
    out, so both orders of writers count each pair once. Without them only pairs
    within the batch are counted.
    """
    by_user: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if is_visit(event):
            by_user[event.user_id].append(event)
    pairs: dict[tuple[str, str], float] = defaultdict(float)
    visits: dict[str, float] = defaultdict(float)
    for user_id, user_events in by_user.items():
        user_events.sort(key=lambda e: e.ts)
        first_ts: dict[str, int] = {}
        for event in user_events:
            first_ts.setdefault(event.video_id, event.ts)
        prior = [
            h.video_id for h in visited((histories or {}).get(user_id, ()))
            if h.ts < first_ts.get(h.video_id, h.ts + 1)
        ][:window]
        for event in user_events:
            video = event.video_id
            if video in prior:
                prior.remove(video)
            else:
                visits[video] += 1.0
                for other in prior:
                    pairs[(video, other)] += 1.0
                    pairs[(other, video)] += 1.0
            prior.insert(0, video)
            del prior[window:]
    return CovisitIncrements(pairs, visits)


def seed_weights(video_ids: Sequence[str], decay: float) -> dict[str, float]:
    """Each recent visit's weight in :func:`cosine_scores`: ``decay ** position``,
    newest first (a video listed twice keeps its newest position)."""
    weights: dict[str, float] = {}
    for position, video in enumerate(video_ids):
        weights.setdefault(video, decay**position)
    return weights


def cosine_scores(
    partners: Mapping[str, Mapping[str, float]],
    seeds: Mapping[str, float],
    visits: Mapping[str, float],
    limit: int | None,
) -> list[tuple[str, float]]:
    """The strongest ``limit`` partners of the seeds by position-decayed cosine (None:
    every partner, in no particular order):
    ``sum over seeds h of weight(h) * pairs(h, c) / sqrt(visits(h) * visits(c))``.

    ``partners``: each seed's partner counts; ``seeds``: :func:`seed_weights`;
    ``visits``: the visit counts of the seeds and partners (a missing one counts
    as 1). Why the cosine rather than the raw count: the raw count ranks every
    user's popular videos first, which popularity already does; on ml-100k's
    leave-one-out the cosine alone scores HR@10 0.595 against the raw count's 0.578,
    and 0.634 against 0.617 beside the model (``docs/retrieval.md``).
    """
    sums: dict[str, float] = defaultdict(float)
    for seed, row in partners.items():
        scale = seeds.get(seed, 0.0) / max(visits.get(seed, 1.0), 1.0) ** 0.5
        if scale:
            for other, count in row.items():
                sums[other] += scale * count
    scored = [
        (video, total / max(visits.get(video, 1.0), 1.0) ** 0.5)
        for video, total in sums.items()
    ]
    if limit is None:
        return scored
    return heapq.nlargest(limit, scored, key=lambda item: item[1])


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

    def covisited(
        self, video_ids: Sequence[str], limit: int | None
    ) -> list[tuple[str, float]]:
        """Partners of ``video_ids`` (a user's recent visits, newest first) by
        :func:`cosine_scores`: the strongest ``limit`` first, or every one unordered
        (None)."""
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
