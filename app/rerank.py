"""Rerank: between the model's scores and the top-K (``docs/rerank.md``).

One call per model-ranked request (:meth:`Reranker.rerank`), after scoring:

1. **Exclusions**, from the user's feedback (one read of
   :mod:`feature_store.signals.feedback`): videos the user disliked never
   come back; with ``exclude_served`` (the request's flag, default
   ``rerank.exclude_served``), videos served to the user within
   ``rerank.served_window_s`` that got no engagement are dropped too (an
   entry whose video the user's history holds at or after the served time
   counts as engaged, whatever order the two arrived in).
2. **Cold start** (:mod:`app.cold_start`): a new video without engagement
   has its score capped by its calibrated posterior mean.
3. **Creator demotion**: a video whose creator the user disliked has its
   score multiplied by ``1 - penalty * 2**(-age / half_life)`` (age since the
   user's latest dislike of that creator): bounded, and fading.
4. **Exploration**: ``rerank.exploration_budget`` of the slots go to new
   videos picked by a Thompson draw from their posteriors (placed in the
   page by their score, like every item).
5. **Diversity**: a greedy pass in score order keeps at most
   ``rerank.max_per_creator`` videos of one creator (0: no cap). The cap is
   strict: a response may hold fewer items than asked rather than break it.

The items keep score order; their scores are the reranked ones (what the
served log records too).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from app.cold_start import ColdStart, NewVideos
from app.scoring.video_table import VideoTable
from feature_store.activity.base import HistoryEntry
from feature_store.features.extract import Indices
from feature_store.settings import RerankSettings
from feature_store.signals.feedback.base import FeedbackView, UserFeedback

Scores = npt.NDArray[np.float32]


def excluded(
    view: FeedbackView,
    history: Sequence[HistoryEntry],
    video_ids: Sequence[str],
    exclude_served: bool,
) -> npt.NDArray[np.bool_]:
    """Which candidates the feedback excludes (see the module docstring, step 1)."""
    drop = np.zeros(len(video_ids), dtype=np.bool_)
    gone = set(view.disliked)
    if exclude_served and view.served:
        engaged = {h.video_id: h.ts for h in history}
        gone.update(
            video for video, at in view.served.items() if engaged.get(video, -1) < at
        )
    if gone:
        drop[[i for i, video in enumerate(video_ids) if video in gone]] = True
    return drop


def creator_demotion(
    view: FeedbackView,
    creators: Sequence[str],
    now_ms: int,
    penalty: float,
    half_life_s: float,
) -> npt.NDArray[np.float64]:
    """Per candidate, the factor its score is multiplied by (1.0: no disliked creator)."""
    factor = np.ones(len(creators))
    if not view.disliked_creators or penalty <= 0:
        return factor
    for i, creator in enumerate(creators):
        at = view.disliked_creators.get(creator)
        if at is not None:
            age_s = max(0.0, (now_ms - at) / 1000.0)
            factor[i] = 1.0 - penalty * 2.0 ** (-age_s / half_life_s)
    return factor


def capped(ranked: Sequence[int], creators: Sequence[str], count: int, cap: int) -> list[int]:
    """The first ``count`` of ``ranked`` keeping at most ``cap`` per creator (0: no cap)."""
    if cap <= 0:
        return list(ranked[:count])
    taken: dict[str, int] = {}
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
    ) -> tuple[Scores, Indices | None]:
        """Reranked scores, and the response's rows in ``video_ids`` best first (None: the
        plain top ``count`` by the scores returned, nothing was excluded or capped)."""
        s = self.settings
        view = self.feedback.read(user_id, now_ms)
        served = s.exclude_served if exclude_served is None else exclude_served
        drop = excluded(view, history, video_ids, served)
        new = self.cold_start.new_videos(table, rows)
        out = scores.astype(np.float64)
        if len(new.positions):
            cold = new.positions[new.engaged == 0]
            out[cold] = np.minimum(out[cold], new.mean[new.engaged == 0])
        creators: list[str] | None = None
        if view.disliked_creators or s.max_per_creator:
            creators = [table.videos[r].creator_id for r in rows.tolist()]
        factor = None
        if view.disliked_creators and creators is not None:
            factor = creator_demotion(
                view, creators, now_ms, s.dislike_creator_penalty, s.dislike_penalty_half_life_s
            )
            out *= factor
        slots = self.cold_start.slots(min(count, int((~drop).sum()))) if len(new.positions) else 0
        if not (drop.any() or slots or s.max_per_creator):
            return out.astype(np.float32), None
        explored = self._explore(new, drop, slots, factor)
        keep = ~drop
        keep[explored] = False
        merit = np.flatnonzero(keep)
        merit = merit[np.argsort(-out[merit], kind="stable")]
        ranked = np.concatenate([explored, merit]).tolist()
        chosen = capped(ranked, creators or [], count, s.max_per_creator)
        order = np.asarray(chosen, dtype=np.int64)
        order = order[np.argsort(-out[order], kind="stable")]
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
        draws[drop[new.positions]] = -np.inf
        best = np.argsort(-draws, kind="stable")[:slots]
        best = best[np.isfinite(draws[best])]
        return new.positions[best].astype(np.int64)
