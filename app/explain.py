"""Why each item was shown: what ``explain: true`` on a recommend request adds.

Built from what the request computed anyway (the pool's proposers, every
head's prediction from the one model run, the bonus terms, the rerank's
trace), so an engineer can answer "why was this video shown to this
user" from the response alone: which sources proposed it, what each ranking
head predicted, how the heads were fused, what the two-tower,
co-visitation, sequence and factorisation terms added to the ranking, and what the rerank did (a new
video's prior and the user's lifts, an exploration slot, a creator demotion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.rerank import RerankTrace
from app.scoring.fusion import Fusion
from feature_store.settings import ApiSettings


def explanations(
    order: np.ndarray,
    proposers: Mapping[str, Sequence[str]],
    ids: Sequence[str],
    heads: Mapping[str, np.ndarray],
    model_scores: np.ndarray,
    scores: np.ndarray,
    terms: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    trace: RerankTrace | None,
) -> list[dict[str, Any]]:
    """One explanation per item of the response (``order``: their candidate positions)."""
    towers, covisited, ordered, factored = terms
    ranking = (np.log(np.clip(scores.astype(np.float64), 1e-9, 1.0))
               + towers + covisited + ordered + factored)
    notes = _rerank_notes(trace)
    return [
        {
            "sources": list(proposers.get(ids[i], ("request",))),
            "heads": {head: float(p[i]) for head, p in heads.items()},
            "model_score": float(model_scores[i]),
            "affinity_bonus": float(towers[i]),
            "covisit_bonus": float(covisited[i]),
            "sequence_bonus": float(ordered[i]),
            "factorization_bonus": float(factored[i]),
            "ranking": float(ranking[i]),
            "rerank": notes.get(i, {}),
        }
        for i in order.tolist()
    ]


def summary(
    fusion: Fusion, settings: ApiSettings, candidates: int, trace: RerankTrace | None
) -> dict[str, Any]:
    """What applies to every item of the response."""
    return {
        "fusion": dict(fusion.weights),
        "retrieval_weight": settings.retrieval_weight,
        "covisit_weight": settings.covisit_weight,
        "sequence_weight": settings.sequence_weight,
        "factorization_weight": settings.factorization_weight,
        "candidates": candidates,
        "excluded": trace.excluded if trace is not None else 0,
    }


def _rerank_notes(trace: RerankTrace | None) -> dict[int, dict[str, Any]]:
    """Per candidate position, what the rerank did (positions it left alone: absent)."""
    if trace is None:
        return {}
    notes: dict[int, dict[str, Any]] = {}
    new = trace.new
    if new is not None:
        for j, position in enumerate(new.positions.tolist()):
            notes[position] = {
                "new_video": True,
                "prior": float(new.mean[j]),
                "lift": float(trace.lift[j]) if trace.lift is not None else None,
                "own_lift": float(new.own[j]),
            }
    for position in trace.explored.tolist():
        notes.setdefault(position, {})["explored"] = True
    if trace.creator_factor is not None:
        for position in np.flatnonzero(trace.creator_factor < 1.0).tolist():
            notes.setdefault(position, {})["creator_factor"] = float(
                trace.creator_factor[position]
            )
    return notes
