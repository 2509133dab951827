"""The served score: a weighted fusion of the ranking heads into one number per candidate.

The model predicts one probability per head (:data:`feature_store.heads.HEADS`:
engagement, watch quantile, explicit negative). The served score is::

    log(score) = sum over heads h of |w_h| * log(p_h)       if w_h >= 0
                                       |w_h| * log(1 - p_h)   if w_h < 0

with ``w`` = ``api.ranking_weights`` (each head's ``fusion_weight`` by default;
or an experiment arm's weights) and
each probability clipped to [1e-7, 1]. So:

- the score is in (0, 1] (every term is <= 0), and its log is the weighted
  combination itself: :mod:`app.recommender`'s later terms (retrieval,
  co-visitation), added on the log of the score, stay on one scale;
- it is monotone in the combination, increasing in every head of positive
  weight and decreasing in every head of negative weight ("less likely to
  be skipped" rather than "more likely", so a negative weight rewards a low
  skip probability instead of subtracting a probability);
- weights ``engagement 1`` and nothing else give the primary (engagement)
  head's probability itself: exactly the score before heads.

A model exported before some heads has not their outputs: their terms are
left out (their weights are ignored); without any weighted head the score
is the primary head's probability. A product of powers rather than a sum of
probabilities: a sum's scale would depend on how many heads there are and
would not be a probability-like number whose log the recommender can add to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from feature_store.heads import PRIMARY
from feature_store.models.model_io import HEADS

Floats = npt.NDArray[np.float32]

_EPS = 1e-7


@dataclass(frozen=True)
class Fusion:
    """Weights over the heads; :meth:`fuse` turns the heads' outputs into one score array."""

    weights: tuple[tuple[str, float], ...]
    """(head, weight) of the heads with a non-zero weight, in HEADS order."""

    @classmethod
    def of(cls, weights: Mapping[str, float]) -> Fusion:
        """From a ``{head: weight}`` mapping (absent heads weigh 0)."""
        return cls(tuple((h, float(weights[h])) for h in HEADS if weights.get(h, 0.0) != 0.0))

    @property
    def identity(self) -> bool:
        """Whether the score is the primary head's probability unchanged."""
        return self.weights == ((PRIMARY.name, 1.0),)

    def fuse(self, heads: Mapping[str, Floats]) -> Floats:
        """One score per row from each head's ``(B,)`` probabilities (see the module doc)."""
        engagement = heads[PRIMARY.name]
        if self.identity:
            return engagement
        total = np.zeros(len(engagement), dtype=np.float64)
        used = 0
        for head, weight in self.weights:
            p = heads.get(head)
            if p is None:  # a model from before this head
                continue
            used += 1
            p64 = np.clip(p.astype(np.float64), _EPS, 1.0)
            if weight >= 0:
                total += weight * np.log(p64)
            else:
                total += -weight * np.log(np.clip(1.0 - p64, _EPS, 1.0))
        if not used:  # every weighted head is missing: the engagement term stands alone
            return engagement
        # Clipped to float32's smallest normal: strong weights must not underflow to 0.
        return np.maximum(np.exp(total), np.finfo(np.float32).tiny).astype(np.float32)


ENGAGEMENT_ONLY = Fusion.of({PRIMARY.name: 1.0})
"""The score before heads."""
