"""The live matrix factorisation's costs: per request, per fit, and to the GIL.

    python -m bench.bench_factorization [--videos 5000] [--candidates 500]
                                        [--pairs 300000] [--users 50000] [--catalog 19000]

1. **Per request**: the service's read of the factor store (in process) and
   :func:`app.scoring.factorization.factorization_scores` for ``--candidates``
   given videos of a ``--videos``-video fit (32 factors): microseconds per
   request, the best of five loops of 2,000.
2. **Per fit**: ``implicit``'s CPU ALS as ``trainer/factorization.py`` runs it
   (one thread, BLAS held to one) on ``--pairs`` random (user, video) pairs of
   ``--users`` users and ``--catalog`` videos: seconds from scratch
   (``factorization.iterations``) and with ``factorization.warm_iterations``, as
   every later fit runs them (a fit's cost is per iteration; starting from the
   previous fit's factors does not change it).
3. **The GIL**: while a from-scratch fit runs on a thread, the longest and the
   99th-percentile gap of a Python loop that sleeps 1 ms a turn on the main
   thread (what the trainer's and the service's threads would wait).

Prints one JSON document with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time

import numpy as np

from bench.machine import cpu_model


def per_request(videos: int, candidates: int) -> float:
    """Microseconds of one request's read and scores (best of five loops)."""
    from app.scoring.factorization import factorization_scores
    from feature_store.factors import MemoryFactors

    rng = np.random.default_rng(0)
    ids = [f"v{i}" for i in range(videos)]
    store = MemoryFactors()
    store.publish(ids, rng.normal(size=(videos, 32)).astype(np.float32), ["u1"],
                  rng.normal(size=(1, 32)).astype(np.float32))
    asked = [ids[i] for i in rng.choice(videos, candidates, replace=False)]
    for _ in range(100):
        factorization_scores(store.read("u1"), asked)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            factorization_scores(store.read("u1"), asked)
        best = min(best, (time.perf_counter() - t0) / 2000)
    return best * 1e6


def fit_seconds(matrix: object, iterations: int, gaps: list[float] | None = None) -> float:
    """Seconds of one fit of ``matrix``; with ``gaps``, a main-thread loop's gaps (seconds)
    while it runs on another thread."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    from feature_store.settings import FactorizationSettings

    s = FactorizationSettings()
    with threadpool_limits(1, "blas"):
        model = AlternatingLeastSquares(factors=s.factors, regularization=s.regularization,
                                        alpha=s.alpha, iterations=iterations, random_state=0,
                                        num_threads=1)
    took: list[float] = []

    def fit() -> None:
        with threadpool_limits(1, "blas"):
            t0 = time.perf_counter()
            model.fit(matrix, show_progress=False)
            took.append(time.perf_counter() - t0)

    thread = threading.Thread(target=fit)
    last = time.perf_counter()
    thread.start()
    while gaps is not None and thread.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    thread.join()
    return took[0]


def main() -> None:
    import scipy.sparse as sp

    from feature_store.settings import FactorizationSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=5000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--catalog", type=int, default=19_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    matrix = sp.csr_matrix(
        (np.ones(args.pairs, np.float32),
         (rng.integers(0, args.users, args.pairs), rng.integers(0, args.catalog, args.pairs))),
        shape=(args.users, args.catalog))
    s = FactorizationSettings()
    gaps: list[float] = []
    scratch = fit_seconds(matrix, s.iterations, gaps)
    warm = fit_seconds(matrix, s.warm_iterations)
    print(json.dumps({
        "machine": f"{cpu_model(platform.machine())}, {os.cpu_count()} cores",
        "load_average_1min": round(os.getloadavg()[0], 2),
        "request_us": round(per_request(args.videos, args.candidates), 1),
        "request": f"{args.candidates} candidates of a {args.videos:,}-video fit, in process",
        "fit_s": {f"scratch_{s.iterations}_iterations": round(scratch, 2),
                  f"warm_{s.warm_iterations}_iterations": round(warm, 2)},
        "fit": f"{args.pairs:,} random pairs, {args.users:,} users, {args.catalog:,} videos",
        "gil_gap_ms_during_fit": {"max": round(max(gaps) * 1000, 2),
                                  "p99": round(float(np.percentile(gaps, 99)) * 1000, 2)},
    }, indent=2))


if __name__ == "__main__":
    main()
