"""Where an in-process recommend's time goes: cProfile over ``bench_serving``'s data.

    python -m bench.profile_recommend [--requests 1500] [--top 25]

Prepares the serving benchmark's data (``bench_serving.prepare``: 5,000
synthetic videos, 50,000 events, a WideDeep model with the retrieval and
sequence towers), opens the service in this process and runs its recommend
(500 given candidates, cycling through the benchmark's requests): first
unprofiled (ms per request: mean, p50, p99), then under cProfile, printing the functions
with the most cumulative time as milliseconds per request (cProfile's own
overhead inflates them, about 1.3x; compare shares, not absolutes). Before
that, both sides of the ranker's run beside the learned terms
(:mod:`app.scoring.overlap`): the run, the helper's work, and the request's
wait after the run. Then
the served log's writer work for the same responses, off the request
thread: packing a record (``ServedLogWriter.to_record``), encoding it and
producing it to the in-process log, per record.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import bench_serving
from bench.machine import cpu_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    from app.schemas import RecommendRequest
    from app.service import open_service
    from feature_store.runtime.resources import open_resources
    from feature_store.served import encode_served

    data_dir = Path(tempfile.mkdtemp(prefix="vidrec-profile-"))
    settings = bench_serving.bench_settings(data_dir, "memory", None)
    bodies = bench_serving.make_requests(bench_serving.DISTINCT_REQUESTS, 500)
    bench_serving.prepare(settings, bodies)
    print(f"{cpu_model(platform.machine())}, {os.cpu_count()} cores; load "
          f"{os.getloadavg()[0]:.2f}; {args.requests} requests of 500 given candidates")
    with open_resources(settings) as resources, open_service(resources) as service:
        recommend = service.recommender.recommend
        requests = [RecommendRequest.model_validate(b) for b in bodies]
        for i in range(300):  # warm: caches, the video table, ONNX
            recommend(requests[i % len(requests)])
        spent = []
        for i in range(args.requests):
            t0 = time.perf_counter()
            recommend(requests[i % len(requests)])
            spent.append((time.perf_counter() - t0) * 1000)
        print(f"unprofiled: {np.mean(spent):.2f} ms a request, p50 {np.median(spent):.2f}, "
              f"p99 {np.percentile(spent, 99):.2f}")
        overlap(recommend, requests, args.requests)

        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.requests):
            recommend(requests[i % len(requests)])
        profile.disable()
        stats = pstats.Stats(profile)
        print(f"profiled, ms a request (cumulative), top {args.top}:")
        rows: list[tuple[float, str]] = []
        for (file, line, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
            where = f"{Path(file).name}:{line}({name})" if line else name
            rows.append((cumulative * 1000 / args.requests, where))
        for ms, where in sorted(rows, reverse=True)[: args.top]:
            print(f"  {ms:7.3f}  {where}")

        writer = service.recommender.served_log
        if writer is None:
            return
        captured: list[Any] = []
        writer.record = captured.append  # type: ignore[method-assign]
        for i in range(300):
            recommend(requests[i % len(requests)])
        t0 = time.perf_counter()
        records = [writer.to_record(s) for s in captured]
        t1 = time.perf_counter()
        for record in records:
            encode_served(record)
        t2 = time.perf_counter()
        writer.log.produce(records)
        t3 = time.perf_counter()
        n = len(captured)
        print(f"served log, ms a record (off the request thread): pack "
              f"{(t1 - t0) * 1000 / n:.3f}, encode {(t2 - t1) * 1000 / n:.3f}, produce "
              f"{(t3 - t2) * 1000 / n:.3f}")


def overlap(recommend: Any, requests: list[Any], count: int) -> None:
    """Both sides of each ranker run beside the learned terms (:mod:`app.scoring.overlap`),
    ms a run: the run on the request's thread, the helper's work, and the request's wait
    for the helper after its run. With a switch interval of 1 ms, as ``vidrec serve``'s."""
    import sys

    from app.scoring import overlap as module
    from app.scoring import scorer

    spent = {"run": 0.0, "helper": 0.0, "wait": 0.0}
    runs = 0

    def timed(run: Any, meanwhile: Any) -> Any:
        nonlocal runs
        if meanwhile is None:
            return run()
        ran_until = [0.0]

        def helper() -> None:
            t = time.perf_counter()
            meanwhile()
            spent["helper"] += time.perf_counter() - t

        def timed_run() -> Any:
            out = run()
            ran_until[0] = time.perf_counter()
            return out

        t0 = time.perf_counter()
        result = module.beside(timed_run, helper)
        spent["run"] += ran_until[0] - t0
        spent["wait"] += time.perf_counter() - ran_until[0]
        runs += 1
        return result

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    scorer.beside = timed  # type: ignore[assignment]
    try:
        for i in range(count):
            recommend(requests[i % len(requests)])
    finally:
        scorer.beside = module.beside
        sys.setswitchinterval(interval)
    if runs:
        print(f"beside the ranker's run ({runs} runs, ms each): the run "
              f"{spent['run'] * 1000 / runs:.2f}, the helper's work "
              f"{spent['helper'] * 1000 / runs:.2f}, the wait for it after the run "
              f"{spent['wait'] * 1000 / runs:.2f}")


if __name__ == "__main__":
    main()
