"""Quality figures computed on aligned arrays of scores and labels.

AUC and logloss are :mod:`feature_store.models.quality`'s, the trainer's own.
Ranking figures take one held-back relevant item per query, so recall@k is
the hit rate and NDCG@k is ``1 / log2(rank + 1)`` when the item ranks within k.

Per sample or per moment: the trainer makes one sample per labelled event,
so a view that ends in a ``finish`` and a ``like`` is two positive samples.
Published figures count one prediction per rating (per moment a user was
shown a video); :func:`moments` groups samples into those.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from feature_store.models.quality import roc_auc

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


def rank_in(item: str, candidates: Sequence[str], scores: Floats) -> int:
    """1-based rank of ``item`` among ``candidates`` by descending score; ties keep the
    candidates' order (give them in a random order for random tie-breaking)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return int(np.flatnonzero(order == list(candidates).index(item))[0]) + 1


def moments(
    user_ids: Sequence[str], video_ids: Sequence[str], ts_ms: npt.NDArray[np.int64],
    labels: Floats, window_ms: int,
) -> tuple[npt.NDArray[np.int64], Floats]:
    """Samples grouped into moments: one (user, video) and the samples within ``window_ms``
    (the trainer's join window) of its first.

    Returns, per moment in order, the index of its first sample (whose score is the
    prediction made at the moment, before any of its outcomes was trained on) and its
    label: positive when any of its samples is.
    """
    first: list[int] = []
    label: list[float] = []
    open_moment: dict[tuple[str, str], tuple[int, int]] = {}
    for i, key in enumerate(zip(user_ids, video_ids, strict=True)):
        ts = int(ts_ms[i])
        found = open_moment.get(key)
        if found is not None and ts - found[1] <= window_ms:
            label[found[0]] = max(label[found[0]], float(labels[i]))
        else:
            open_moment[key] = (len(first), ts)
            first.append(i)
            label.append(float(labels[i]))
    return np.asarray(first, dtype=np.int64), np.asarray(label, dtype=np.float64)


def recall_ndcg(ranks: Sequence[int | None], k: int) -> tuple[float, float]:
    """Mean recall@k and NDCG@k over queries with one relevant item each."""
    if not ranks:
        return float("nan"), float("nan")
    hits = [r for r in ranks if r is not None and r <= k]
    recall = len(hits) / len(ranks)
    ndcg = sum(1.0 / np.log2(r + 1) for r in hits) / len(ranks)
    return float(recall), float(ndcg)
