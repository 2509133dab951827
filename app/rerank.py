"""Rerank: between the model's scores and the top-K (``docs/rerank.md``).

One call per model-ranked request (:meth:`Reranker.rerank`), after scoring:

1. **Exclusions**, from the user's feedback (one read of
   :mod:`feature_store.signals.feedback`): videos the user disliked never
   come back; with ``exclude_served`` (the request's flag, default
   ``rerank.exclude_served``), videos served to the user within
   ``rerank.served_window_s`` that got no engagement are dropped too (a
   positive entry of the user's history at or after the served time clears
   an entry, whatever order the two arrived in: only engaged events write
   one).
2. **Cold start** (:mod:`app.cold_start`): a new video scores its calibrated
   posterior mean moved by the user's lifts (the model's score for this user
   against an anonymous one's, and the user's own history of its category
   and creator), blending into the model's score as its exposure grows.
3. **Creator demotion**: a video whose creator the user disliked has its
   score multiplied by ``1 - penalty * 2**(-age / half_life)`` (age since the
   user's latest dislike of that creator): bounded, and fading.
4. **Exploration**: ``rerank.exploration_budget`` of the slots go to new
   videos uploaded within ``rerank.explore_max_age_s``, picked by a Thompson
   draw from their posteriors (placed in the page by their score, like every
   item).
5. **Diversity**: a greedy pass in score order keeps at most
   ``rerank.max_per_creator`` videos of one creator (0: no cap). The cap is
   strict: a response may hold fewer items than asked rather than break it.

The items keep score order; their scores are the reranked ones (what the
served log records too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.cold_start import ColdStart, NewVideos, logit
from app.scoring.ranking import fuse, top_k
from app.scoring.video_table import VideoTable
from feature_store.activity.base import HistoryEntry
from feature_store.features.extract import Indices
from feature_store.settings import RerankSettings
from feature_store.signals.feedback.base import FeedbackView, UserFeedback

Scores = npt.NDArray[np.float32]

AnonymousScores = Callable[[Indices], npt.NDArray[np.float32]]
"""The model's scores of the given candidate positions for an anonymous user (no id, no
history) in the request's context."""


class RowFacts:
    """Per row of one video table, filled as rows are added: a small integer per creator
    and the upload time, so that a request's are one fancy index rather than 500
    attribute reads. A row never changes creator or upload time (a record that differs
    in a feature field gets a new row); an emptied table is noticed by its new ``row_of``.
    """

    def __init__(self) -> None:
        self._of: dict[str, int] = {}
        self._codes = np.zeros(0, dtype=np.int64)
        self._uploaded = np.zeros(0, dtype=np.float64)
        self._filled = 0
        self._row_of: object = None

    def code(self, creator: str) -> int | None:
        return self._of.get(creator)

    def of_rows(
        self, table: VideoTable, rows: Indices
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Creator codes and upload times (ms) of ``rows``."""
        if self._row_of is not table.row_of:
            self.__init__()  # type: ignore[misc]
            self._row_of = table.row_of
        size, done = len(table.videos), self._filled
        if size > done:
            if size > len(self._codes):
                capacity = max(1024, 2 * size)
                codes, uploaded = np.zeros(capacity, np.int64), np.zeros(capacity)
                codes[:done], uploaded[:done] = self._codes[:done], self._uploaded[:done]
                self._codes, self._uploaded = codes, uploaded
            of = self._of
            added = table.videos[done:size]
            self._codes[done:size] = [of.setdefault(v.creator_id, len(of)) for v in added]
            self._uploaded[done:size] = [v.uploaded_at for v in added]
            self._filled = size
        return self._codes[rows], self._uploaded[rows]


def excluded(
    view: FeedbackView,
    history: Sequence[HistoryEntry],
    table: VideoTable,
    rows: Indices,
    exclude_served: bool,
) -> npt.NDArray[np.bool_]:
    """Which candidates (``rows`` of ``table``) the feedback excludes (module doc, step 1)."""
    gone = list(view.disliked)
    if exclude_served and view.served:
        watched = {h.video_id: h.ts for h in history if h.positive}
        gone += [video for video, at in view.served.items() if watched.get(video, -1) < at]
    at = [r for r in map(table.row_of.get, gone) if r is not None]
    if not at:
        return np.zeros(len(rows), dtype=np.bool_)
    return np.isin(rows, at)


def creator_demotion(
    view: FeedbackView,
    codes: RowFacts,
    creators: npt.NDArray[np.int64],
    now_ms: int,
    penalty: float,
    half_life_s: float,
) -> npt.NDArray[np.float64] | None:
    """Per candidate (``creators``: their creator codes), the factor its score is
    multiplied by; None when no candidate's creator was disliked."""
    factor_of: dict[int, float] = {}
    for creator, at in view.disliked_creators.items():
        code = codes.code(creator)
        if code is not None:
            age_s = max(0.0, (now_ms - at) / 1000.0)
            factor_of[code] = 1.0 - penalty * 2.0 ** (-age_s / half_life_s)
    if not factor_of or penalty <= 0:
        return None
    hit = np.flatnonzero(np.isin(creators, list(factor_of)))
    if not len(hit):
        return None
    factor = np.ones(len(creators))
    factor[hit] = [factor_of[c] for c in creators[hit].tolist()]
    return factor


def capped(ranked: Sequence[int], creators: Sequence[int], count: int, cap: int) -> list[int]:
    """The first ``count`` of ``ranked`` keeping at most ``cap`` per creator (0: no cap)."""
    if cap <= 0:
        return list(ranked[:count])
    taken: dict[int, int] = {}
    out: list[int] = []
    for i in ranked:
        creator = creators[i]
        if taken.get(creator, 0) >= cap:
            continue
        taken[creator] = taken.get(creator, 0) + 1
        out.append(i)
        if len(out) == count:
            break
    return out


@dataclass
class RerankTrace:
    """What one rerank did, kept when a request asks for an explanation."""

    new: NewVideos | None = None
    """The new videos among the candidates, with their priors."""
    lift: npt.NDArray[np.float64] | None = None
    """Per new video, the user's lift (log-odds against an anonymous user; None: none)."""
    explored: Indices = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Positions that took an exploration slot."""
    creator_factor: npt.NDArray[np.float64] | None = None
    """Per candidate, the factor of the creator demotion (None: none demoted)."""
    excluded: int = 0


class Reranker:
    """Applies the steps of the module docstring. Thread-safe."""

    def __init__(
        self,
        settings: RerankSettings,
        feedback: UserFeedback,
        cold_start: ColdStart | None = None,
    ) -> None:
        self.settings = settings
        self.feedback = feedback
        self.cold_start = cold_start or ColdStart(settings)
        self._local = threading.local()

    def _facts(self) -> RowFacts:
        """This thread's row facts (its video table is this thread's too)."""
        facts: RowFacts | None = getattr(self._local, "facts", None)
        if facts is None:
            facts = self._local.facts = RowFacts()
        return facts

    def rerank(
        self,
        user_id: str,
        now_ms: int,
        history: Sequence[HistoryEntry],
        exclude_served: bool | None,
        video_ids: Sequence[str],
        table: VideoTable,
        rows: Indices,
        scores: Scores,
        count: int,
        bonus: npt.NDArray[np.float64] | None = None,
        anonymous: AnonymousScores | None = None,
        trace: RerankTrace | None = None,
        view: FeedbackView | None = None,
    ) -> tuple[Scores, Indices]:
        """Reranked scores, and the response's rows in ``video_ids`` best first.
        ``bonus``: what the ranking adds to the log of a score
        (:func:`app.scoring.ranking.ranking_bonus`); merit is ``log score + bonus``.
        ``anonymous``: the model's scores of candidate positions for an anonymous user
        (asked for the new videos only; None: no lift, see :mod:`app.cold_start`).
        ``trace``: filled with what was done (an explained request). ``view``: the user's
        feedback at ``now_ms``, when the caller read it already (with the history)."""
        s = self.settings
        if view is None:
            view = self.feedback.read(user_id, now_ms)
        served = s.exclude_served if exclude_served is None else exclude_served
        drop = excluded(view, history, table, rows, served)
        facts = self._facts()
        by_row, uploaded = facts.of_rows(table, rows)
        new = self.cold_start.new_videos(table, rows, uploaded, now_ms, history)
        out = scores.astype(np.float64)
        reference = None
        if len(new.positions):
            reference = anonymous(new.positions) if anonymous is not None else None
            if trace is not None and reference is not None:
                trace.lift = logit(out[new.positions]) - logit(reference)
            out[new.positions] = self.cold_start.blend(new, out[new.positions], reference)
        creators: list[int] = []
        factor = None
        if view.disliked_creators or s.max_per_creator:
            creators = by_row.tolist()
            factor = creator_demotion(
                view, facts, by_row, now_ms, s.dislike_creator_penalty,
                s.dislike_penalty_half_life_s,
            )
            if factor is not None:
                out *= factor
        slots = self.cold_start.slots(min(count, int((~drop).sum()))) if new.fresh.any() else 0
        rank = fuse(out, bonus)
        if trace is not None:
            trace.new, trace.creator_factor, trace.excluded = new, factor, int(drop.sum())
        if not (drop.any() or slots or s.max_per_creator):
            return out.astype(np.float32), top_k(rank, count)
        explored = self._explore(new, drop, slots, factor)
        if trace is not None:
            trace.explored = explored
        keep = ~drop
        keep[explored] = False
        merit = np.flatnonzero(keep)
        merit = merit[np.argsort(-rank[merit], kind="stable")]
        ranked = np.concatenate([explored, merit]).tolist()
        chosen = capped(ranked, creators, count, s.max_per_creator)
        order = np.asarray(chosen, dtype=np.int64)
        order = order[np.argsort(-rank[order], kind="stable")]
        return out.astype(np.float32), order

    def _explore(
        self,
        new: NewVideos,
        drop: npt.NDArray[np.bool_],
        slots: int,
        factor: npt.NDArray[np.float64] | None,
    ) -> Indices:
        """Positions of the new videos that win the exploration slots, best draw first
        (draws demoted like any score)."""
        if not slots or not len(new.positions):
            return np.zeros(0, dtype=np.int64)
        draws = self.cold_start.draw(new)
        if factor is not None:
            draws = draws * factor[new.positions]
        draws[drop[new.positions] | ~new.fresh] = -np.inf
        best = np.argsort(-draws, kind="stable")[:slots]
        best = best[np.isfinite(draws[best])]
        return new.positions[best].astype(np.int64)
