"""Quality figures of scores against 0/1 labels, shared by the trainer and the evaluation.

The trainer's prequential metrics and ``vidrec eval`` report the same AUC and
logloss, so they compute them with the same code.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def roc_auc(scores: Floats, labels: Floats) -> float:
    """ROC AUC by ranks (Mann-Whitney U), ties counted half; NaN if one class is absent."""
    positives = labels > 0.5
    n_pos = int(positives.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # Average rank within groups of equal scores.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    avg = (starts + ends + 1) / 2.0  # 1-based average rank of each group
    ranks[order] = np.repeat(avg, ends - starts)
    u = ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def log_loss(scores: Floats, labels: Floats, weights: Floats | None = None) -> float:
    """Mean (or ``weights``-weighted) binary cross-entropy, probabilities clipped to
    [1e-7, 1 - 1e-7]; NaN for no samples (or zero total weight)."""
    p = np.clip(scores, 1e-7, 1 - 1e-7)
    losses = -(labels * np.log(p) + (1 - labels) * np.log1p(-p))
    if weights is None:
        return float(losses.mean()) if len(losses) else float("nan")
    total = weights.sum()
    return float((losses * weights).sum() / total) if total > 0 else float("nan")
