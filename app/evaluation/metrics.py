"""Quality figures computed on aligned arrays of scores and labels.

AUC and logloss are :mod:`feature_store.quality`'s, the trainer's own.
Ranking figures take one held-back relevant item per query, so recall@k is
the hit rate and NDCG@k is ``1 / log2(rank + 1)`` when the item ranks within k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from feature_store.quality import roc_auc

Floats = npt.NDArray[np.float64]


def windows(n: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous slices of ``range(n)`` of (nearly) equal size."""
    edges = np.linspace(0, n, max(1, min(count, n)) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def windowed_auc(
    scores: Floats, labels: Floats, slices: Sequence[tuple[int, int]]
) -> list[float]:
    return [roc_auc(scores[a:b], labels[a:b]) for a, b in slices]


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
