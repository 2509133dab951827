"""The matrix-factorisation baseline's algorithm and settings, picked on a validation split.

    python bench/tune_mf.py DATASET [--candidates 99] [--seed 0] [--quick]

DATASET is a positive-only log ``vidrec eval --protocol loo`` reads (a
MovieLens directory, every rating a view). The test views (each user's last,
what ``vidrec eval --protocol loo`` holds out) are removed first and never
read; each user's *second-to-last* view is then the validation item, ranked
among ``--candidates`` videos the user never touched (anywhere in the log)
and against the whole catalog minus the user's earlier views, HR@10 and
NDCG@10 as ``vidrec eval`` counts them.

Two ways of training, both on the views before the validation ones only:

1. **static** (the split of NCF and its successors): one fit on every
   training view of every user, whatever its time. Every setting of ALS's
   grid and of ``implicit``'s BPR's is measured this way (one fit each);
2. **point-in-time**, as ``vidrec eval`` runs the baseline
   (:class:`app.evaluation.factorization.MatrixFactorization`): item factors
   refit every ``refit_every`` views, the user's factor folded in at the
   moment from their views before it (only ALS can fold a user in; about 50
   fits per setting on ml-100k). The three best static ALS settings run
   this way; the best of them is the baseline's default, then its refit
   interval is varied.

Prints one line per setting, best sampled HR@10 first within each part, the
chosen setting and the machine.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.evaluation.factorization import (  # noqa: E402
    AlsParams,
    MatrixFactorization,
    als,
    fit_quietly,
)
from app.evaluation.feed import Sampler, views  # noqa: E402
from app.evaluation.metrics import rank_in, recall_ndcg  # noqa: E402
from app.evaluation.stream import load_stream  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from feature_store.settings import EventLimits  # noqa: E402

FOLLOW_UP_MS = 60_000
"""The trainer's join window: rows of one (user, video) within it are one view."""
K = 10


@dataclass
class Split:
    users: list[str]
    videos: list[str]
    """The training views in time order (user and video of each)."""
    queries: list[tuple[str, str, int, tuple[str, ...], tuple[str, ...]]]
    """(user, held-out video, training views before it, sampled candidates, full-ranking
    candidates) per validation query, in time order."""


def validation_split(path: Path, candidates: int, seed: int) -> Split:
    stream = load_stream(path, "auto", EventLimits(), implicit=True)
    events = stream.events
    catalog = sorted({v.video_id for v in stream.videos} or {e.video_id for e in events})
    grouped = [events[rows[0]] for rows in views(events, FOLLOW_UP_MS)]
    by_user: dict[str, list[int]] = {}
    for n, view in enumerate(grouped):
        by_user.setdefault(view.user_id, []).append(n)
    touched: dict[str, set[str]] = {}
    for view in grouped:
        touched.setdefault(view.user_id, set()).add(view.video_id)
    test = {ns[-1] for ns in by_user.values() if len(ns) >= 2}
    held = {ns[-2] for ns in by_user.values() if len(ns) >= 3}
    sampler = Sampler(catalog, seed)
    split = Split([], [], [])
    for n, view in enumerate(grouped):
        if n in test:
            continue
        if n in held:
            earlier = {grouped[m].video_id for m in by_user[view.user_id] if m < n}
            sampled = sampler.shuffled(
                [view.video_id, *sampler.untouched(touched[view.user_id], candidates)])
            full = tuple(v for v in catalog if v == view.video_id or v not in earlier)
            split.queries.append((view.user_id, view.video_id, len(split.users), sampled, full))
            continue
        split.users.append(view.user_id)
        split.videos.append(view.video_id)
    return split


def _figures(ranks: list[int]) -> tuple[float, float]:
    return recall_ndcg(list(ranks), K)


def point_in_time(split: Split, params: AlsParams, seed: int) -> tuple[float, ...]:
    model = MatrixFactorization(split.users, split.videos, np.ones(len(split.users), bool),
                                params, seed)
    sampled, full = [], []
    for user, video, before, cands, everything in split.queries:
        sampled.append(rank_in(video, cands, model.scores(user, cands, before)))
        full.append(rank_in(video, everything, model.scores(user, everything, before)))
    return (*_figures(sampled), *_figures(full))


def static(split: Split, model: object) -> tuple[float, ...]:
    """One fit on every training view; the users' factors are the fit's."""
    import scipy.sparse as sp

    users = {u: i for i, u in enumerate(dict.fromkeys(split.users))}
    videos = {v: i for i, v in enumerate(dict.fromkeys(split.videos))}
    pairs = {(users[u], videos[v]) for u, v in zip(split.users, split.videos, strict=True)}
    rows, cols = (np.array(x) for x in zip(*sorted(pairs), strict=True))
    matrix = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                           shape=(len(users), len(videos)))
    fit_quietly(model, matrix)
    item = np.asarray(model.item_factors)  # type: ignore[attr-defined]
    user = np.asarray(model.user_factors)  # type: ignore[attr-defined]
    sampled, full = [], []
    for u, video, _, cands, everything in split.queries:
        for out, group in ((sampled, cands), (full, everything)):
            codes = np.array([videos.get(c, -1) for c in group])
            scores = np.full(len(group), -np.inf)
            if u in users:
                scores[codes >= 0] = item[codes[codes >= 0]] @ user[users[u]]
            out.append(rank_in(video, group, scores))
    return (*_figures(sampled), *_figures(full))


def bpr(factors: int, learning_rate: float, regularization: float, iterations: int,
        seed: int) -> object:
    from implicit.cpu.bpr import BayesianPersonalizedRanking
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        return BayesianPersonalizedRanking(
            factors=factors, learning_rate=learning_rate, regularization=regularization,
            iterations=iterations, random_state=seed,
        )


def _line(name: str, figures: tuple[float, ...], seconds: float) -> str:
    hr, ndcg, full_hr, full_ndcg = figures
    return (f"{name:<72} HR@10 {hr:.4f} NDCG@10 {ndcg:.4f} | full HR@10 {full_hr:.4f} "
            f"NDCG@10 {full_ndcg:.4f} | {seconds:.1f} s")


Run = tuple[str, tuple[float, ...], float]
"""A setting's name, its figures (sampled HR@10, NDCG@10; full HR@10, NDCG@10) and seconds."""


def _part(title: str, runs: list[Run]) -> None:
    print(f"\n{title} (best sampled HR@10 first)")
    for name, figures, seconds in sorted(runs, key=lambda r: (-r[1][0], -r[1][1])):
        print(_line(name, figures, seconds))


def _timed(name: str, run: Callable[[], tuple[float, ...]]) -> Run:
    t0 = time.perf_counter()
    figures = run()
    return name, figures, time.perf_counter() - t0


def _best(runs: list[Run]) -> Run:
    return max(runs, key=lambda r: (r[1][0], r[1][1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset")
    p.add_argument("--candidates", type=int, default=99)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small grid (checks the script)")
    args = p.parse_args()
    seed = args.seed
    started = time.perf_counter()
    split = validation_split(Path(args.dataset), args.candidates, seed)
    print(f"{args.dataset}: {len(split.users):,} training views, {len(split.queries):,} "
          f"validation users (their second-to-last view; the last never read)")
    grid = [AlsParams(factors=f, regularization=r, alpha=a, refit_every=2000)
            for f, r, a in itertools.product(
        (32, 64, 128), (0.01, 0.1, 1.0), (1.0, 5.0, 20.0))]
    bpr_grid = list(itertools.product((32, 64, 128), (0.01, 0.05), (0.01,), (100, 300)))
    if args.quick:
        grid, bpr_grid = grid[:2], bpr_grid[:1]
    # 1. Every setting, static (one fit each: cheap), ALS and BPR.
    als_runs = {params: _timed(params.describe().split(", item")[0],
                               lambda params=params: static(split, als(params, seed)))
                for params in grid}
    _part("ALS, static", list(als_runs.values()))
    _part("BPR, static", [
        _timed(f"BPR, {f} factors, learning rate {lr:g}, regularization {reg:g}, {n} "
               "iterations", lambda f=f, lr=lr, reg=reg, n=n: static(split, bpr(f, lr, reg, n,
                                                                               seed)))
        for f, lr, reg, n in bpr_grid
    ])
    # 2. The three best ALS settings as vidrec eval runs them (point-in-time), and the
    # refit interval of the best of those.
    top = sorted(als_runs, key=lambda params: (-als_runs[params][1][0],
                                               -als_runs[params][1][1]))[:3]
    runs = {params: _timed(params.describe(), lambda params=params: point_in_time(split, params,
                                                                                  seed))
            for params in top}
    _part("ALS, point-in-time, the three best static settings", list(runs.values()))
    chosen = max(runs, key=lambda params: (runs[params][1][0], runs[params][1][1]))
    for every in (500, 2000, 8000):
        params = replace(chosen, refit_every=every)
        if params not in runs:
            runs[params] = _timed(params.describe(),
                                  lambda params=params: point_in_time(split, params, seed))
    _part("ALS, point-in-time, refit interval of the best",
          [runs[p] for p in runs if replace(p, refit_every=0) == replace(chosen, refit_every=0)])
    chosen = max(runs, key=lambda params: (runs[params][1][0], runs[params][1][1]))
    print(f"\nchosen (the best point-in-time line): {chosen.describe()}")
    print(f"machine: {cpu_model(platform.machine())}, {os.cpu_count()} cores, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
