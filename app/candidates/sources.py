"""The candidate sources: each proposes videos for one request, from one signal.

A source (:class:`CandidateSource`) has a ``name`` (what a response item's
``source`` says), says whether it is ``personal`` (it reads the user's
history; a user without one is not asked) and proposes at most ``limit``
video ids, best first, for a :class:`CandidateQuery`. Sources read the shared
signals (:mod:`feature_store.signals`), the catalog, the history entries
(which carry each watched video's creator and category) and the request's
user vector, so every serving process sees the same candidates. How much of
the pool each one fills is ``api.candidate_sources``
(:mod:`app.candidates.retrieval`); a new source is a class here, its entry in
:func:`build_sources` and a share in that setting.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, cast

from feature_store.activity.base import HistoryEntry, visited, watched
from feature_store.catalog.base import CatalogStore
from feature_store.settings import ApiSettings
from feature_store.signals.base import CandidateSignals
from feature_store.sparse.steps import Steps, at_once, run, stepped

EMBEDDING = "embedding"
"""Nearest videos to the user's two-tower vector (``app/scoring/retrieval.py``)."""
COVISIT = "covisit"
"""Videos co-watched with the user's recent watches (updated online)."""
CATEGORIES = "categories"
"""What trends in the categories the user watched most."""
CREATORS = "creators"
"""Newest uploads of the creators the user watched most."""
TRENDING = "trending"
"""Real-time trending: decayed engagement counts from the event stream."""
FRESH = "fresh"
"""Newest visible uploads within the fresh window."""
REQUEST = "request"
"""Candidates the caller passed in (no source asked)."""

TASTE_HISTORY = 30
"""Recent watches (positive entries) looked at to find the user's creators and categories."""
TOP_CREATORS = 5
TOP_CATEGORIES = 3

Nearest = Callable[[int, Collection[str]], list[str]]
"""``(k, exclude) -> ids``: the request's user vector's nearest videos, best first."""


@dataclass
class CandidateQuery:
    """What the sources know of one request."""

    user_id: str
    history: Sequence[HistoryEntry]
    """Newest first: every action (:class:`~feature_store.activity.base.HistoryEntry`)."""
    now_ms: int
    exclude: Collection[str] = ()
    """Videos the request excludes (seen), which a search can skip."""
    nearest: Nearest | None = None
    """The user vector's search (None: no towers, or no vector for this user)."""
    covisits: list[tuple[str, float]] | None = field(default=None, repr=False)
    """Co-visitation read once per request (the source and the ranking bonus share it)."""

    @cached_property
    def visited(self) -> list[HistoryEntry]:
        """The entries of videos the user watched at all, newest first (co-visitation's
        seeds)."""
        return visited(self.history)

    @cached_property
    def watched(self) -> list[HistoryEntry]:
        """The positive entries (what the user valued), newest first."""
        return watched(self.history)


@dataclass(frozen=True)
class Proposal:
    """A source's videos, best first, and their strengths where it has them."""

    videos: list[str]
    weights: list[float] | None = None
    """Per video, the source's own strength (co-visitation cosines), else None."""


class CandidateSource(Protocol):
    """One way of finding candidates (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def personal(self) -> bool:
        """Reads the user's history or vector: not asked for a user without history."""
        ...

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        """At most ``limit`` videos, best first, as steps (:mod:`feature_store.sparse.steps`):
        a source whose stores read Redis sends its commands with the other sources' and
        the request waits for them all once."""
        ...


@dataclass(frozen=True)
class Embedding:
    """The towers' nearest videos to the user vector."""

    name: str = EMBEDDING
    personal: bool = True

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        nearest = query.nearest  # an in-memory search: no read to share
        if nearest is None:
            return at_once(lambda: Proposal([]))
        return at_once(lambda: Proposal(nearest(limit, query.exclude)))


@dataclass(frozen=True)
class Covisit:
    """Videos co-visited with the user's ``window`` most recent visits, with their cosine
    (:func:`~feature_store.signals.base.cosine_scores`)."""

    signals: CandidateSignals
    window: int
    name: str = COVISIT
    personal: bool = True

    def read(self, query: CandidateQuery) -> list[tuple[str, float]]:
        """Every partner's cosine, in no particular order, read once per query: the
        ranking's term scores every candidate co-visited with a seed, whichever source
        proposed it (on ml-100k's leave-one-out, keeping only the 300 strongest left
        the held-out video without its term in 200 of 943 questions)."""
        (pairs,) = run([self.read_steps(query)])
        return cast(list[tuple[str, float]], pairs)

    def read_steps(self, query: CandidateQuery) -> Steps[list[tuple[str, float]]]:
        """:meth:`read` as steps (:mod:`feature_store.sparse.steps`): with Redis signals,
        its read shares a round trip with the request's other reads."""
        if query.covisits is None:
            recent = [entry.video_id for entry in query.visited[: self.window]]
            query.covisits = (
                (yield from stepped(self.signals, "covisited", recent, None)) if recent else []
            )
        return query.covisits

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        pairs = heapq.nlargest(limit, (yield from self.read_steps(query)), key=_weight)
        return Proposal([v for v, _ in pairs], [w for _, w in pairs])


@dataclass(frozen=True)
class Creators:
    """Newest uploads of the creators of the user's recent watches, most watched first."""

    signals: CandidateSignals
    catalog: CatalogStore
    name: str = CREATORS
    personal: bool = True

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        recent = query.watched[:TASTE_HISTORY]
        creators = [e.creator_id for e in recent if e.creator_id]
        unknown = [e.video_id for e in recent if not e.creator_id]  # entries from before
        if unknown:
            creators += [v.creator_id for v in self.catalog.get_many(unknown) if v is not None]
        top = [creator for creator, _ in Counter(creators).most_common(TOP_CREATORS)]
        if not top:
            return Proposal([])
        return Proposal((yield from stepped(self.signals, "creator_videos", top, limit)))


@dataclass(frozen=True)
class Categories:
    """What trends in the categories of the user's recent watches, most watched first."""

    signals: CandidateSignals
    name: str = CATEGORIES
    personal: bool = True

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        counts = Counter(e.category for e in query.watched[:TASTE_HISTORY] if e.category)
        top = [category for category, _ in counts.most_common(TOP_CATEGORIES)]
        if not top:
            return Proposal([])
        return Proposal((yield from stepped(self.signals, "category_videos", top, limit)))


@dataclass(frozen=True)
class Trending:
    """Real-time trending, for everyone."""

    signals: CandidateSignals
    name: str = TRENDING
    personal: bool = False

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        trending = yield from stepped(self.signals, "trending", limit)
        return Proposal([video for video, _ in trending])


@dataclass(frozen=True)
class Fresh:
    """The newest visible uploads within ``window_s``, for everyone."""

    catalog: CatalogStore
    window_s: float
    name: str = FRESH
    personal: bool = False

    def propose_steps(self, query: CandidateQuery, limit: int) -> Steps[Proposal]:
        since = query.now_ms - int(self.window_s * 1000)
        recent = yield from stepped(self.catalog, "recent", limit, since)
        return Proposal([v.video_id for v in recent])


def build_sources(
    signals: CandidateSignals, catalog: CatalogStore, settings: ApiSettings
) -> dict[str, CandidateSource]:
    """Every source the service knows, by name (``api.candidate_sources`` picks and weighs)."""
    sources: list[CandidateSource] = [
        Embedding(),
        Covisit(signals, settings.covisit_window),
        Categories(signals),
        Creators(signals, catalog),
        Trending(signals),
        Fresh(catalog, settings.fresh_window_s),
    ]
    return {source.name: source for source in sources}


SOURCE_NAMES = (EMBEDDING, COVISIT, CATEGORIES, CREATORS, TRENDING, FRESH)
"""The names :func:`build_sources` gives (what ``api.candidate_sources`` may name)."""
PERSONAL = frozenset({EMBEDDING, COVISIT, CATEGORIES, CREATORS})
"""The sources that need a history."""


def _weight(pair: tuple[str, float]) -> float:
    return pair[1]
