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
    ranks = _ranks(scores)
    u = ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def _ranks(values: Floats) -> Floats:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    boundaries = np.flatnonzero(np.diff(sorted_values)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(values)]])
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def spearman(scores: Floats, targets: Floats) -> float:
    """Spearman rank correlation (ties averaged); NaN under 3 pairs or a constant side.

    The watch head's figure: its target is a quantile, so what matters is
    whether the head orders plays as their watch quantiles do, not its scale.
    """
    if len(scores) < 3:
        return float("nan")
    a, b = _ranks(scores), _ranks(targets)
    a -= a.mean()
    b -= b.mean()
    denominator = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else float("nan")


def mean_abs_error(scores: Floats, targets: Floats) -> float:
    """Mean absolute error; NaN for no pairs."""
    return float(np.abs(scores - targets).mean()) if len(scores) else float("nan")


def log_loss(scores: Floats, labels: Floats, weights: Floats | None = None) -> float:
    """Mean (or ``weights``-weighted) binary cross-entropy, probabilities clipped to
    [1e-7, 1 - 1e-7]; NaN for no samples (or zero total weight)."""
    p = np.clip(scores, 1e-7, 1 - 1e-7)
    losses = -(labels * np.log(p) + (1 - labels) * np.log1p(-p))
    if weights is None:
        return float(losses.mean()) if len(losses) else float("nan")
    total = weights.sum()
    return float((losses * weights).sum() / total) if total > 0 else float("nan")
