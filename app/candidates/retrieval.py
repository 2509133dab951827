"""The pool of candidates: the sources' proposals, by their shares, deduplicated.

Each source (:mod:`app.candidates.sources`) named in ``api.candidate_sources``
is asked for its share of ``api.max_candidates`` (with room for what the
filters will drop, at most ``api.source_limit``); a user without history asks
only the sources that need none, their shares scaled up. The proposals are
merged by **weighted round-robin**: the next video comes from the source
furthest below its share of what has been taken so far, so the first ``N``
videos of the pool hold each source in proportion to its share, whatever
``N`` the filters leave, and a source that runs out leaves its room to the
others. A video proposed by several sources keeps the first source's name and
lists them all (:attr:`Pool.proposers`).

A recommend request filters its candidates in the scorer's per-video rows
(:meth:`app.scoring.video_table.VideoTable.passing`: unknown and hidden
videos, the user's already-seen videos, the request's categories and longest
duration); :meth:`Retriever.resolve` applies the same :class:`CandidateFilter`
to catalog records, for the degraded mode's popular list.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from app.candidates.sources import (
    COVISIT,
    CandidateQuery,
    CandidateSource,
    Covisit,
    Proposal,
    build_sources,
)
from feature_store.catalog.base import CatalogStore, Video
from feature_store.settings import ApiSettings
from feature_store.signals.base import CandidateSignals
from feature_store.sparse.steps import Steps, run

OVERASK = 1.5
"""Each source is asked for this much more than its share: some proposals are seen, hidden
or filtered out, and the pool should still fill."""


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


@dataclass
class Pool:
    """The candidates of one request, in pool order."""

    videos: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """The first source that proposed each video (what its response item says)."""
    proposers: dict[str, list[str]] = field(default_factory=dict)
    """Every source that proposed a video, by video (the explanation of an item)."""
    covisits: dict[str, float] = field(default_factory=dict)
    """Co-visitation cosines of the videos the covisit source found (a ranking term)."""


class Retriever:
    """Builds each request's :class:`Pool` from the sources (see the module docstring)."""

    def __init__(
        self,
        catalog: CatalogStore,
        signals: CandidateSignals,
        settings: ApiSettings,
        videos: Callable[[Sequence[str]], list[Video | None]] | None = None,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.videos = videos or catalog.get_many
        """Bulk catalog read used to filter (the service passes its cached reader)."""
        known = build_sources(signals, catalog, settings)
        self.plan: list[tuple[CandidateSource, float]] = [
            (known[name], share) for name, share in settings.candidate_sources.items()
        ]
        """The sources asked, in order, with their shares (``api.candidate_sources``)."""
        covisit = known[COVISIT]
        assert isinstance(covisit, Covisit)
        self.covisit = covisit

    def covisits(self, query: CandidateQuery) -> dict[str, float]:
        """Co-visitation cosines for ``query``'s user (read once per query): the ranking's
        term, also for a request that brings its own candidates."""
        if not query.visited:
            return {}
        return dict(self.covisit.read(query))

    def covisit_steps(self, query: CandidateQuery, given: bool) -> Steps[object] | None:
        """The co-visitation read ``query`` will make, as steps (the ranking term's for
        ``given`` candidates, else the covisit source's and the term's): begun before the
        towers' row reads, both take one round trip with Redis. None when the query reads
        none."""
        if not query.visited:
            return None
        if given or any(source.name == COVISIT for source, _, _ in self._asks(query)):
            return self.covisit.read_steps(query)
        return None

    def _asks(self, query: CandidateQuery) -> list[tuple[CandidateSource, float, int]]:
        """The sources asked for ``query``, each with its share and how many videos."""
        personal = bool(query.history)
        plan = [(s, share) for s, share in self.plan if personal or not s.personal]
        total = sum(share for _, share in plan)
        cap = self.settings.max_candidates
        return [
            (source, share,
             min(self.settings.source_limit, math.ceil(share / total * cap * OVERASK)))
            for source, share in plan
        ]

    def retrieve(self, query: CandidateQuery) -> Pool:
        """The pool for ``query`` (see the module docstring)."""
        asks = list(self._asks(query))
        # Every source's reads sent together: with Redis stores, one wait for them all.
        proposed = run([source.propose_steps(query, wanted) for source, _, wanted in asks])
        proposals = [
            (source.name, share, cast(Proposal, proposal))
            for (source, share, _), proposal in zip(asks, proposed, strict=True)
        ]
        pool = merge(proposals)
        if query.covisits is not None:  # every partner, not only those proposed
            pool.covisits = dict(query.covisits)
        return pool

    def resolve(self, pool: Pool, keep: CandidateFilter, cap: int) -> list[Candidate]:
        """Catalog records of the pool's videos that pass ``keep``, at most ``cap``."""
        records = self.videos(pool.videos)
        out = [
            Candidate(video, source)
            for source, video in zip(pool.sources, records, strict=True)
            if video is not None and keep.keeps(video)
        ]
        return out[:cap]


def merge(proposals: Sequence[tuple[str, float, Proposal]]) -> Pool:
    """Weighted round-robin over ``(name, share, proposal)`` (see the module docstring):
    a heap of the sources by ``(taken + 1) / share``, ties to the earlier source.

    The source on top is replaced in place (one sift, not a pop and a push), and not
    moved at all after a video proposed before, which leaves its key as it was (about
    750 proposed videos a retrieval)."""
    pool = Pool()
    proposers, videos_out, sources_out = pool.proposers, pool.videos, pool.sources
    names = [name for name, _, _ in proposals]
    shares = [share for _, share, _ in proposals]
    lists = [proposal.videos for _, _, proposal in proposals]
    heap = [(1.0 / share, i, 0, 0) for i, (_, share, p) in enumerate(proposals) if p.videos]
    heapq.heapify(heap)
    get, replace, pop = proposers.get, heapq.heapreplace, heapq.heappop
    while heap:
        key, i, at, taken = heap[0]
        videos = lists[i]
        video = videos[at]
        found = get(video)
        at += 1
        if found is None:
            proposers[video] = [names[i]]
            videos_out.append(video)
            sources_out.append(names[i])
            taken += 1
            if at < len(videos):
                replace(heap, ((taken + 1) / shares[i], i, at, taken))
            else:
                pop(heap)
            continue
        if names[i] not in found:
            found.append(names[i])
        if at < len(videos):
            heap[0] = (key, i, at, taken)  # the same key: still the least
        else:
            pop(heap)
    return pool
