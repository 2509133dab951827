"""The union of candidate sources: deduplicated, filtered and capped before scoring.

Sources are interleaved round-robin (embedding, covisit, creators, trending,
fresh), so
the cap takes the best of each rather than all of the first; a video found
by several sources keeps the first source's name. A recommend request
filters its candidates in the scorer's per-video rows
(:meth:`app.scoring.video_table.VideoTable.passing`: unknown and hidden
videos, the user's already-seen videos, the request's categories and longest
duration); :meth:`Retriever.resolve` applies the same :class:`CandidateFilter`
to catalog records, for the degraded mode's popular list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from app.candidates import sources
from feature_store.activity.base import HistoryEntry
from feature_store.catalog.base import CatalogStore, Video
from feature_store.settings import ApiSettings
from feature_store.signals.base import CandidateSignals, interleave


class Candidate(NamedTuple):
    """A video to score and the source that proposed it (a tuple: 500 per request)."""

    video: Video
    source: str


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

    def covisits(self, history: Sequence[HistoryEntry]) -> list[tuple[str, float]]:
        """Videos co-watched with the user's recent watches and their counts, strongest
        first (the covisit source, and a term of the ranking score)."""
        window = self.settings.covisit_window
        return sources.covisited(self.signals, history, window, self.settings.source_limit)

    def retrieve(
        self,
        history: Sequence[HistoryEntry],
        now_ms: int,
        personal: bool = True,
        embedding: Sequence[str] = (),
        covisits: Sequence[tuple[str, float]] | None = None,
    ) -> list[tuple[str, str]]:
        """``(video_id, source)`` pairs, deduplicated, in interleaved source order.

        ``personal=False`` (unknown users, fallbacks) uses trending and fresh only.
        ``embedding``: the user vector's nearest videos (the caller searched them with
        the request's model version), leading the interleave. ``covisits``: what
        :meth:`covisits` returned, when the caller already asked.
        """
        limit = self.settings.source_limit
        since = now_ms - int(self.settings.fresh_window_s * 1000)
        named: list[tuple[str, list[str]]] = []
        if personal and history:
            if embedding:
                named.append((sources.EMBEDDING, list(embedding[:limit])))
            if covisits is None:
                covisits = self.covisits(history)
            named.append((sources.COVISIT, [video for video, _ in covisits]))
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
        self, proposed: Sequence[tuple[str, str]], keep: CandidateFilter, cap: int
    ) -> list[Candidate]:
        """Catalog records of the proposed ids that pass ``keep``, at most ``cap``."""
        videos = self.videos([video_id for video_id, _ in proposed])
        out = [
            Candidate(video, source)
            for (_, source), video in zip(proposed, videos, strict=True)
            if video is not None and keep.keeps(video)
        ]
        return out[:cap]
