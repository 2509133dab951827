"""The live matrix factorisation's term of the ranking (``trainer/factorization.py``).

At each request the service reads the newest fit's video factors (cached per
version by the store) and the asking user's factor, folded in by the trainer
from all of the user's views up to their last batch (:mod:`feature_store.factors`),
and scores each candidate by the dot product. The ranking adds
``api.factorization_weight`` times that score standardised over the request's
candidates (:func:`app.scoring.ranking.bonus_terms`): one scale whatever the
fit, as the screen that chose the term measured it (``bench/als_signal_screen.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feature_store.factors.base import ItemFactors, Vectors

Read = tuple[ItemFactors | None, Vectors | None]
"""A user's read of the factor store: the newest fit's videos and the user's factor."""


def factorization_scores(read: Read | None, ids: Sequence[str]) -> np.ndarray | None:
    """Each candidate's factorisation score standardised over the candidates with a factor
    (those without one, first chosen after the newest fit, get 0, their mean: no evidence
    either way); None: no fit, no factor for the user, or no candidate with one.
    ``read``: what :meth:`FactorStore.read` gave for the asking user."""
    if not ids or read is None:
        return None
    items, user = read
    if items is None or user is None or len(user) != items.dim:
        return None
    rows = items.rows(ids)
    has = rows >= 0
    if not has.any():
        return None
    raw = items.vectors[rows[has]].astype(np.float64) @ user.astype(np.float64)
    standard = (raw - raw.mean()) / (raw.std() + 1e-9)
    out = np.zeros(len(ids))
    out[has] = standard
    return out
