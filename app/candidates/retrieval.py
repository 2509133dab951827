"""The union of candidate sources: deduplicated, filtered and capped before scoring.

Sources are interleaved round-robin (covisit, creators, trending, fresh), so
the cap takes the best of each rather than all of the first; a video found
by several sources keeps the first source's name. Filtering needs the
catalog records anyway (they feed the features), so it costs one
``get_many`` for the whole union: unknown and hidden videos, the user's
already-seen videos and the request's filters (categories, longest duration)
are dropped there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_not
from typing import NamedTuple

from app.candidates import sources
from feature_store.activity.base import HistoryEntry
from feature_store.catalog.base import CatalogStore, Video
from feature_store.settings import ApiSettings
from feature_store.signals.base import CandidateSignals, interleave


class Candidate(NamedTuple):
    """A video to score and the source that proposed it."""

    video: Video
    source: str


class Resolved(NamedTuple):
    """Candidates that passed the filter, as parallel lists (no object per item)."""

    video_ids: list[str]
    videos: list[Video]
    sources: list[str]

    def candidates(self) -> list[Candidate]:
        return list(map(Candidate, self.videos, self.sources))


_hidden = attrgetter("hidden")


@dataclass(frozen=True)
class CandidateFilter:
    """What a request excludes."""

    seen: frozenset[str] = frozenset()
    categories: frozenset[str] | None = None
    """Keep only these categories (None: any)."""
    max_duration_ms: int | None = None

    def keeps(self, video: Video) -> bool:
        if video.hidden or video.video_id in self.seen:
            return False
        if self.categories is not None and video.category not in self.categories:
            return False
        return self.max_duration_ms is None or video.duration_ms <= self.max_duration_ms


class Retriever:
    """Finds candidates for a user from every source (see the module docstring)."""

    def __init__(
        self,
        catalog: CatalogStore,
        signals: CandidateSignals,
        settings: ApiSettings,
        videos: Callable[[Sequence[str]], list[Video | None]] | None = None,
    ) -> None:
        self.catalog = catalog
        self.signals = signals
        self.settings = settings
        self.videos = videos or catalog.get_many
        """Bulk catalog read used to filter (the service passes its cached reader)."""

    def retrieve(
        self, history: Sequence[HistoryEntry], now_ms: int, personal: bool = True
    ) -> list[tuple[str, str]]:
        """``(video_id, source)`` pairs, deduplicated, in interleaved source order.

        ``personal=False`` (unknown users, fallbacks) uses trending and fresh only.
        """
        limit = self.settings.source_limit
        since = now_ms - int(self.settings.fresh_window_s * 1000)
        named: list[tuple[str, list[str]]] = []
        if personal and history:
            window = self.settings.covisit_window
            named.append((sources.COVISIT, sources.covisited(self.signals, history, window, limit)))
            named.append(
                (sources.CREATORS, sources.creators(self.signals, self.catalog, history, limit))
            )
        named.append((sources.TRENDING, sources.trending(self.signals, limit)))
        named.append((sources.FRESH, sources.fresh(self.catalog, limit, since)))
        tagged = [[(video, name) for video in ids] for name, ids in named]
        seen: set[str] = set()
        out: list[tuple[str, str]] = []
        for video, name in interleave(tagged, sum(map(len, tagged))):
            if video not in seen:
                seen.add(video)
                out.append((video, name))
        return out

    def resolve(
        self,
        video_ids: Sequence[str],
        sources: Sequence[str],
        keep: CandidateFilter,
        cap: int,
    ) -> Resolved:
        """Catalog records of the proposed ids (each from ``sources[i]``) that pass ``keep``.

        At most ``cap``, in the order proposed. Per-item work is kept to
        C-level passes where it can be (``map`` over ``attrgetter``): a request
        resolves 500 ids, and a Python-level loop costs ~0.2 ms.
        """
        videos = self.videos(video_ids)
        seen, categories, longest = keep.seen, keep.categories, keep.max_duration_ms
        if (
            not seen
            and categories is None
            and longest is None
            and all(map(is_not, videos, repeat(None)))
            and not any(map(_hidden, videos))
        ):  # the usual request: every id known and shown, no filters
            return Resolved(
                list(video_ids[:cap]), videos[:cap], list(sources[:cap])  # type: ignore[arg-type]
            )
        kept = [
            i
            for i, video in enumerate(videos)
            if video is not None
            and not video.hidden
            and video.video_id not in seen
            and (categories is None or video.category in categories)
            and (longest is None or video.duration_ms <= longest)
        ][:cap]
        return Resolved(
            [video_ids[i] for i in kept],
            [videos[i] for i in kept],  # type: ignore[misc]
            [sources[i] for i in kept],
        )
