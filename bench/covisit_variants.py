"""Which co-visitation signal: variants of it on the questions of a ``screen_loo`` dump.

    python -m bench.screen_loo ../shared/datasets/ml-100k --dump F.npz
    python -m bench.covisit_variants F.npz ../shared/datasets/ml-100k/u.data

Replays the ratings in the evaluation's order (``(ts, user, item)``, each
user's held-out last view left out) into a dense co-visitation matrix and,
at each question's moment (ratings of earlier seconds only: the question is
asked 300 ms before its view), scores the dump's candidates by variants of
the signal the service reads (``feature_store/signals/base.py``): each new
visit paired with the user's 10 previous ones, read as the cosine
``sum over seeds h of 0.8**position(h) * pairs(h, c) / sqrt(visits(h) visits(c))``.
Variants: what counts as a visit (every rating, as the service counts a play of
any length; or ratings >= 4 only, positives), the raw count instead of the
cosine, how many recent visits are seeds, how many partners a video keeps (the
strongest counts, ``api.covisit_neighbors``; 0: all). For each: HR@10 alone,
and cross-fitted (:mod:`bench.fusion_ceiling`) in a linear fusion with the
dump's log p, sequence and affinity columns (its own co-visitation column
left out), so a variant is judged by what it adds to the rest.

A dense ``items x items`` matrix: for MovieLens-size catalogs (ml-100k: 1,682).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import fusion_ceiling
from bench.machine import cpu_model

DECAY = 0.8
WINDOW = 10
VARIANTS = (  # (name, least rating that is a visit, cosine, seeds, partners kept)
    ("service: visits, cosine, 10 seeds, 200 kept", 1, True, 10, 200),
    ("positives only", 4, True, 10, 200),
    ("raw count", 1, False, 10, 200),
    ("100 kept", 1, True, 10, 100),
    ("400 kept", 1, True, 10, 400),
    ("all kept", 1, True, 10, 0),
    ("20 seeds, 400 kept", 1, True, 20, 400),
)


def ratings_of(path: Path) -> np.ndarray:
    """``(user, item, rating, seconds)`` rows in the evaluation's order."""
    rows = np.loadtxt(path, dtype=np.int64)
    return rows[np.lexsort((rows[:, 1], rows[:, 0], rows[:, 3]))]


def variant_scores(dump: Any, rows: np.ndarray, shift_ms: int) -> dict[str, list[np.ndarray]]:
    """Per variant, per question, the candidates' scores as of the question's moment
    (``shift_ms``: :func:`bench.fusion_ceiling.shift_of`)."""
    users = [int(str(u)[2:]) for u in dump["users"]]
    held = set(zip(users, (int(str(v)[2:]) for v in dump["held"]), strict=True))
    # A question's moment is 300 ms before its rating's second, so it sees the ratings
    # of earlier seconds only.
    asked = [(int(ts) - shift_ms) // 1000 for ts in dump["ts"]]
    order = np.argsort(asked, kind="stable")
    items = int(rows[:, 1].max()) + 1
    least = sorted({v[1] for v in VARIANTS})
    pairs = {m: np.zeros((items, items), np.float32) for m in least}
    visits = {m: np.zeros(items, np.float32) for m in least}
    history: dict[int, dict[int, list[int]]] = {m: defaultdict(list) for m in least}
    out: dict[str, list[np.ndarray]] = {v[0]: [np.empty(0)] * len(users) for v in VARIANTS}

    def answer(k: int) -> None:
        ids = np.array([int(v[2:]) for v in dump["rankings"][k]["ids"]])
        for name, m, cosine, seeds, kept in VARIANTS:
            recent = np.array(history[m][users[k]][::-1][:seeds], np.int64)
            if not len(recent):
                out[name][k] = np.zeros(len(ids))
                continue
            rows_ = pairs[m][recent].copy()
            if kept:
                weakest = np.argpartition(-rows_, kept, axis=1)[:, kept:]
                np.put_along_axis(rows_, weakest, 0, 1)
            block = rows_[:, ids]
            if cosine:
                block = block / np.sqrt(np.maximum(visits[m][recent], 1))[:, None]
                block = block / np.sqrt(np.maximum(visits[m][ids], 1))
            out[name][k] = (block * (DECAY ** np.arange(len(recent)))[:, None]).sum(0)

    next_question = 0
    for user, item, rating, second in rows.tolist():
        while next_question < len(order) and asked[order[next_question]] <= second:
            answer(int(order[next_question]))
            next_question += 1
        if (user, item) in held:
            continue
        for m in least:
            if rating < m:
                continue
            before = history[m][user]
            if item not in before[-WINDOW:]:
                prior = np.array(before[-WINDOW:], np.int64)
                visits[m][item] += 1
                pairs[m][item, prior] += 1
                pairs[m][prior, item] += 1
            before.append(item)
    while next_question < len(order):
        answer(int(order[next_question]))
        next_question += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path, help="bench.screen_loo --dump output (.npz)")
    parser.add_argument("ratings", type=Path, help="the replayed ratings (ml-100k's u.data)")
    args = parser.parse_args()
    dump = np.load(args.dump, allow_pickle=True)
    shift = fusion_ceiling.shift_of(dump, args.ratings)
    x, mask, target = fusion_ceiling.features(
        dump, fusion_ceiling.views_before(args.ratings), shift)
    even = torch.tensor([int(str(u)[2:]) % 2 == 0 for u in dump["users"]])
    print(f"{cpu_model(platform.machine())}, {os.cpu_count()} cores; {len(target)} questions")
    print(f"the service's own ranking: HR@10 "
          f"{fusion_ceiling.hit_rate(x[:, :, fusion_ceiling.SERVICE], mask, target):.4f}")
    scores = variant_scores(dump, ratings_of(args.ratings), shift)
    for name, per_question in scores.items():
        column = torch.zeros(x.shape[:2] + (1,), dtype=x.dtype)
        for k, s in enumerate(per_question):
            column[k, : len(s), 0] = torch.from_numpy(np.log1p(np.asarray(s) / 0.1))
        with_it = torch.cat([x, column], 2)
        alone = fusion_ceiling.hit_rate(with_it[:, :, -1], mask, target)
        fused = fusion_ceiling.cross_fitted(
            fusion_ceiling.linear, with_it, mask, target, even, [0, 2, 3, with_it.shape[2] - 1])
        print(f"{name}: alone {alone:.4f}, fused with log p, sequence, affinity {fused:.4f}")


if __name__ == "__main__":
    main()
