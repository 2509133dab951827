"""Quality figures computed on aligned arrays of scores and labels.

AUC is the rank statistic (Mann-Whitney U, ties counted half), the same as the
trainer's prequential AUC; logloss clips probabilities to [1e-7, 1 - 1e-7].
Ranking figures take one held-back relevant item per query, so recall@k is
the hit rate and NDCG@k is ``1 / log2(rank + 1)`` when the item ranks within k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def auc(scores: Floats, labels: Floats) -> float:
    """ROC AUC by ranks; NaN when one class is absent."""
    positives = labels > 0.5
    n_pos = int(positives.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def logloss(scores: Floats, labels: Floats) -> float:
    if len(scores) == 0:
        return float("nan")
    p = np.clip(scores, 1e-7, 1 - 1e-7)
    return float(-(labels * np.log(p) + (1 - labels) * np.log1p(-p)).mean())


def windows(n: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous slices of ``range(n)`` of (nearly) equal size."""
    edges = np.linspace(0, n, max(1, min(count, n)) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def windowed_auc(
    scores: Floats, labels: Floats, slices: Sequence[tuple[int, int]]
) -> list[float]:
    return [auc(scores[a:b], labels[a:b]) for a, b in slices]


def rank_of(item: str, ranked: Sequence[str]) -> int | None:
    """1-based rank of ``item`` in ``ranked``, None when absent."""
    try:
        return ranked.index(item) + 1
    except ValueError:
        return None


def recall_ndcg(ranks: Sequence[int | None], k: int) -> tuple[float, float]:
    """Mean recall@k and NDCG@k over queries with one relevant item each."""
    if not ranks:
        return float("nan"), float("nan")
    hits = [r for r in ranks if r is not None and r <= k]
    recall = len(hits) / len(ranks)
    ndcg = sum(1.0 / np.log2(r + 1) for r in hits) / len(ranks)
    return float(recall), float(ndcg)
