"""The ranking order of a request's candidates: ``log p`` plus what retrieval adds.

One definition for the recommender (its top-K) and the rerank (its merit
order after exclusions and exploration), so the two never order differently.
"""

from __future__ import annotations

import numpy as np

COSINE_UNIT = 0.1
"""The co-visitation cosine that the ranking counts as ``log 2`` (times
``covisit_weight``): the term is ``log1p(cosine / COSINE_UNIT)``, about linear below
a tenth and logarithmic above, so one strong partner does not outweigh the model."""


def bonus_terms(
    size: int,
    affinity: np.ndarray | None,
    covisits: np.ndarray | None,
    retrieval_weight: float,
    covisit_weight: float,
    sequence: np.ndarray | None = None,
    sequence_weight: float = 0.0,
    factorized: np.ndarray | None = None,
    factorization_weight: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four terms the ranking adds to ``log p``, per candidate:
    ``retrieval_weight * (affinity - max affinity)``,
    ``covisit_weight * log1p(covisit cosine / COSINE_UNIT)``,
    ``sequence_weight * (sequence logit - max logit)`` and
    ``factorization_weight * (factorisation score - max score)``.

    ``affinity`` is the cosine of user and video vectors (None: no towers);
    ``covisits`` each candidate's co-visitation cosine with the user's recent visits
    (:func:`feature_store.signals.base.cosine_scores`; None: none known);
    ``sequence`` the sequence tower's logit of each candidate after the user's recent
    views (None: no tower, or no known view);
    ``factorized`` the live factorisation's score standardised over the candidates
    (:func:`app.scoring.factorization.factorization_scores`; None: no factor).
    Subtracting the best keeps a term at most 0, so it only reorders within the
    request (the sequence term is then its log-softmax over the candidates plus a
    per-request constant).
    """
    towers, covisited, ordered = np.zeros(size), np.zeros(size), np.zeros(size)
    if affinity is not None and len(affinity) and retrieval_weight:
        towers = retrieval_weight * (affinity - affinity.max())
    if covisits is not None and covisit_weight:
        covisited = covisit_weight * np.log1p(covisits / COSINE_UNIT)
    if sequence is not None and len(sequence) and sequence_weight:
        ordered = sequence_weight * (sequence - sequence.max())
    factored = np.zeros(size)
    if factorized is not None and len(factorized) and factorization_weight:
        factored = factorization_weight * (factorized - factorized.max())
    return towers, covisited, ordered, factored


def ranking_bonus(
    size: int,
    affinity: np.ndarray | None,
    covisits: np.ndarray | None,
    retrieval_weight: float,
    covisit_weight: float,
    sequence: np.ndarray | None = None,
    sequence_weight: float = 0.0,
    factorized: np.ndarray | None = None,
    factorization_weight: float = 0.0,
) -> np.ndarray:
    """What the ranking adds to ``log p``: the sum of :func:`bonus_terms`."""
    towers, covisited, ordered, factored = bonus_terms(
        size, affinity, covisits, retrieval_weight, covisit_weight, sequence, sequence_weight,
        factorized, factorization_weight,
    )
    return towers + covisited + ordered + factored


def top_k(ranking: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` highest of ``ranking``, best first (ties: earlier first)."""
    k = min(count, len(ranking))
    if k < len(ranking):
        top = np.argpartition(-ranking, k - 1)[:k]
        return top[np.argsort(-ranking[top], kind="stable")]
    return np.argsort(-ranking, kind="stable")


def fuse(scores: np.ndarray, bonus: np.ndarray | None = None) -> np.ndarray:
    """The ranking score: ``log p + bonus`` (:func:`ranking_bonus`); ``scores`` is
    the model's probability of a positive outcome (whatever the scorer fuses
    into one, and the rerank adjusts)."""
    fused = np.log(np.clip(scores.astype(np.float64), 1e-9, 1.0))
    return fused if bonus is None else fused + bonus
