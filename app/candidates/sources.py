"""The candidate sources, each a function of what is known about the user.

Each returns video ids, best first, at most ``limit``; the name of the source
is what a response item's ``source`` says. They read only the shared signals
(:mod:`feature_store.signals`) and the catalog, so every serving process sees
the same candidates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from feature_store.activity.base import HistoryEntry, watched
from feature_store.catalog.base import CatalogStore
from feature_store.signals.base import CandidateSignals

EMBEDDING = "embedding"
"""Nearest videos to the user's two-tower vector (``app/scoring/retrieval.py``)."""
TRENDING = "trending"
"""Real-time trending: decayed engagement counts from the event stream."""
FRESH = "fresh"
"""Newest visible uploads within the fresh window."""
COVISIT = "covisit"
"""Videos co-watched with the user's recent watches (updated online)."""
CREATORS = "creators"
"""Newest uploads of the creators the user watched most."""
REQUEST = "request"
"""Candidates the caller passed in."""

CREATOR_HISTORY = 20
"""Recent watches (positive entries) looked at to find the user's creators."""
TOP_CREATORS = 5


def trending(signals: CandidateSignals, limit: int) -> list[str]:
    return [video for video, _ in signals.trending(limit)]


def fresh(catalog: CatalogStore, limit: int, since_ms: int) -> list[str]:
    return [video.video_id for video in catalog.recent(limit, since_ms=since_ms)]


def covisited(
    signals: CandidateSignals, history: Sequence[HistoryEntry], window: int, limit: int
) -> list[tuple[str, float]]:
    """Videos co-watched with the ``window`` most recent watches, with their counts."""
    recent = [entry.video_id for entry in watched(history)[:window]]
    return signals.covisited(recent, limit) if recent else []


def creators(
    signals: CandidateSignals,
    catalog: CatalogStore,
    history: Sequence[HistoryEntry],
    limit: int,
) -> list[str]:
    recent = [entry.video_id for entry in watched(history)[:CREATOR_HISTORY]]
    if not recent:
        return []
    counts = Counter(v.creator_id for v in catalog.get_many(recent) if v is not None)
    top = [creator for creator, _ in counts.most_common(TOP_CREATORS)]
    return signals.creator_videos(top, limit) if top else []
