"""How cost grows with the work: the scale curves of issue #16.

    python bench/bench_scale.py [--catalog 10000,100000,1000000] [--candidates 100,500,2000]
                                [--rows 100000,1000000,10000000] [--plot docs/scale.png]

Three curves, each point measured in its own subprocess so that its memory
figure is its own (``VmRSS`` and the peak ``VmHWM`` from ``/proc/self/status``):

1. **Serving against catalog size and candidate count.** For each catalog
   size a data directory is prepared (a synthetic catalog of that many
   videos, 50,000 events in the activity store and the candidate signals,
   the sparse rows the requests touch admitted, an exported WideDeep
   activated). A fresh process then opens the service on it, exactly as
   ``vidrec serve`` does minus HTTP, and times ``Recommender.recommend`` in
   process for 100, 500 and 2,000 given candidates drawn from the whole
   catalog, and for a retrieval request (no candidates: the sources pick up
   to ``api.max_candidates``). Figures: p50/p99 ms per call, and the process's
   resident memory after the calls (the API's memory; the process has
   imported the same modules as ``vidrec serve``). HTTP adds a constant
   (``bench_serving``'s ``http_round_trip_404``) and JSON work linear in
   ``count``, not in the catalog.
2. **Training against sparse-table rows.** The training pipeline of
   ``bench_training`` (the real ``OnlineTrainer`` loop on in-memory tables,
   60,000 synthetic events after a 20,000-event warm-up) with the tables
   pre-filled with that many extra rows (random keys spread over the
   tables, as old users and videos would be): events/s and resident memory.
   Redis memory per row is ``bench/redis_memory.py``'s figure.
3. **Retrieval against catalog size**, where the learned retrieval exists:
   the index build time over that many video vectors and one query's p50.

Results are printed, written to ``bench/results/scale.json`` and, with
``--plot``, drawn into one PNG (log-scaled x axes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_serving import N_USERS as USERS  # noqa: E402  (the same synthetic users)
from bench.machine import cpu_model  # noqa: E402

DISTINCT_REQUESTS = 40
CALLS = 200
"""Timed ``recommend`` calls per point (after ``DISTINCT_REQUESTS`` warm-up calls)."""
LARGEST_BUCKET = 2048


def memory_mb() -> dict[str, float]:
    """Resident (``VmRSS``) and peak resident (``VmHWM``) memory of this process, MiB."""
    out: dict[str, float] = {}
    with open("/proc/self/status", encoding="utf-8") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) / 1024
    return {"rss_mib": out.get("VmRSS", 0.0), "peak_mib": out.get("VmHWM", 0.0)}


def _summary(ms: list[float]) -> dict[str, float]:
    arr = np.asarray(ms)
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def _serving_settings(data_dir: Path) -> Any:
    from feature_store.settings import Settings

    return Settings(
        data_dir=data_dir,
        api={
            "signal_feed": False,
            "max_candidates": 2000,
            "batch_buckets": (16, 64, 128, 256, 512, 1024, LARGEST_BUCKET),
        },
    )


def _requests(videos: int, candidates: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DISTINCT_REQUESTS):
        body: dict[str, Any] = {
            "user_id": f"u{int(rng.integers(0, USERS))}",
            "count": 20,
            "exclude_seen": False,
            "context": {"device": "phone", "surface": "home", "country": "US"},
        }
        if candidates:
            ids = rng.choice(videos, size=candidates, replace=False)
            body["candidates"] = [f"v{int(i)}" for i in ids]
        out.append(body)
    return out


def prepare_serving(data_dir: Path, videos: int, candidate_counts: list[int]) -> dict[str, Any]:
    """Fill ``data_dir`` for a catalog of ``videos`` (run in its own process): the
    serving benchmark's preparation (``bench_serving.prepare``: catalog, events,
    admitted rows, a model with the retrieval towers) over every point's requests."""
    from bench.bench_serving import prepare

    t0 = time.perf_counter()
    requests = [body for count in candidate_counts for body in _requests(videos, count, count)]
    prepare(_serving_settings(data_dir), requests, videos=videos)
    return {"prepare_s": time.perf_counter() - t0}


def measure_serving(data_dir: Path, videos: int, candidate_counts: list[int]) -> dict[str, Any]:
    """Open the service on ``data_dir`` and time recommend per candidate count."""
    from app.schemas import RecommendRequest
    from app.service import open_service
    from feature_store.runtime.resources import open_resources

    settings = _serving_settings(data_dir)
    before = memory_mb()
    out: dict[str, Any] = {"videos": videos, "memory_before_open": before, "points": []}
    with open_resources(settings) as res, open_service(res) as service:
        out["memory_opened"] = memory_mb()
        for count in [*candidate_counts, 0]:
            parsed = [
                RecommendRequest.model_validate(b) for b in _requests(videos, count, seed=count)
            ]
            for req in parsed:  # warm: video rows, buckets
                service.recommender.recommend(req)
            times = []
            for i in range(CALLS):
                t0 = time.perf_counter()
                service.recommender.recommend(parsed[i % len(parsed)])
                times.append((time.perf_counter() - t0) * 1000)
            out["points"].append({"candidates": count or "retrieval", **_summary(times)})
        out["memory_after"] = memory_mb()
    return out


def measure_training(rows: int, events: int, warmup: int) -> dict[str, Any]:
    """Events/s of the training pipeline with ``rows`` extra rows in the tables."""
    from bench.bench_training import _settings, pipeline_rate
    from feature_store.sim.world import SyntheticWorld, WorldConfig

    world = SyntheticWorld(WorldConfig(users=20_000, videos=50_000, creators=2_000, seed=0))
    stream = world.events(events + 1024)
    with tempfile.TemporaryDirectory(prefix="vidrec-scale-") as tmp:
        settings = _settings(Path(tmp), "memory", 1024, 1, None)
        figures = pipeline_rate(
            settings, SyntheticWorld(world.config), stream, warmup, measured=events,
            prefill_rows=rows,
        )
    return {"rows": rows, **figures, **memory_mb()}


def measure_retrieval(videos: int) -> dict[str, Any] | None:
    """Index build and query time over ``videos`` vectors, when the index exists."""
    try:
        from app.candidates.ann import VideoIndex  # type: ignore[import-not-found]
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(256, 32)).astype(np.float32)
    vectors = centres[rng.integers(0, 256, size=videos)] + 0.3 * rng.normal(
        size=(videos, 32)
    ).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"v{i}" for i in range(videos)]
    t0 = time.perf_counter()
    index = VideoIndex.build(ids, vectors)
    build_s = time.perf_counter() - t0
    times = []
    for i in range(200):
        t0 = time.perf_counter()
        index.search(vectors[i], 500, frozenset())
        times.append((time.perf_counter() - t0) * 1000)
    return {"videos": videos, "build_s": build_s, **_summary(times), **memory_mb()}


def _child(args: list[str]) -> dict[str, Any]:
    """Run one point in a fresh interpreter; its last stdout line is the JSON result."""
    done = subprocess.run(
        [sys.executable, __file__, "--point", *args],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    serving = results["serving"]
    labels = [p["candidates"] for p in serving[0]["points"]] if serving else []
    for i, label in enumerate(labels):
        xs = [s["videos"] for s in serving]
        ax.plot(xs, [s["points"][i]["p50_ms"] for s in serving], marker="o",
                label=f"{label} candidates p50" if label != "retrieval" else "retrieval p50")
    ax.set_xscale("log")
    ax.set_xlabel("catalog size (videos)")
    ax.set_ylabel("recommend, ms (in process)")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot([s["videos"] for s in serving], [s["memory_after"]["rss_mib"] for s in serving],
             "k--", marker="s", label="API memory (MiB)")
    ax2.set_ylabel("resident memory, MiB")
    ax2.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("serving against catalog size")
    ax = axes[1]
    training = results["training"]
    ax.plot([t["rows"] for t in training], [t["events_per_s"] for t in training], marker="o")
    ax.set_xscale("log")
    ax.set_xlabel("sparse-table rows")
    ax.set_ylabel("training events/s (memory tables)")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot([t["rows"] for t in training], [t["rss_mib"] for t in training], "k--", marker="s")
    ax2.set_ylabel("resident memory, MiB")
    ax2.set_ylim(bottom=0)
    ax.set_title("training against table rows")
    ax = axes[2]
    retrieval = [r for r in results["retrieval"] if r]
    if retrieval:
        ax.plot([r["videos"] for r in retrieval], [r["build_s"] for r in retrieval], marker="o",
                label="index build, s")
        ax.plot([r["videos"] for r in retrieval], [r["p50_ms"] for r in retrieval], marker="s",
                label="query p50, ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax.set_xlabel("catalog size (video vectors)")
    ax.set_title("retrieval index against catalog size")
    fig.suptitle(results["machine"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _point(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "prepare":
        out = prepare_serving(Path(rest[0]), int(rest[1]), [int(c) for c in rest[2].split(",")])
    elif kind == "serve":
        out = measure_serving(Path(rest[0]), int(rest[1]), [int(c) for c in rest[2].split(",")])
    elif kind == "train":
        out = measure_training(int(rest[0]), int(rest[1]), int(rest[2]))
    else:
        out = measure_retrieval(int(rest[0]))  # type: ignore[assignment]
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--catalog", default="10000,100000,1000000")
    parser.add_argument("--candidates", default="100,500,2000")
    parser.add_argument("--rows", default="100000,1000000,10000000")
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale.json")
    parser.add_argument("--point", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        _point(args.point)
        return 0
    load_before = os.getloadavg()
    where = (f"{cpu_model(platform.machine())}, {os.cpu_count()} cores, Python "
             f"{platform.python_version()}, load before {load_before[0]:.2f}")
    results: dict[str, Any] = {"machine": where, "serving": [], "training": [], "retrieval": []}
    for videos in [int(v) for v in args.catalog.split(",")]:
        with tempfile.TemporaryDirectory(prefix="vidrec-scale-") as tmp:
            prepared = _child(["prepare", tmp, str(videos), args.candidates])
            point = _child(["serve", tmp, str(videos), args.candidates])
        point["prepare_s"] = prepared["prepare_s"]
        results["serving"].append(point)
        cells = ", ".join(
            f"{p['candidates']}: {p['p50_ms']:.2f}/{p['p99_ms']:.2f} ms" for p in point["points"]
        )
        print(f"catalog {videos:>9,}: {cells}; API memory "
              f"{point['memory_after']['rss_mib']:.0f} MiB", flush=True)
        retrieval = _child(["retrieval", str(videos)])
        results["retrieval"].append(retrieval)
        if retrieval:
            print(f"  index over {videos:,} vectors: build {retrieval['build_s']:.2f} s, "
                  f"query p50 {retrieval['p50_ms']:.3f} ms", flush=True)
    for rows in [int(r) for r in args.rows.split(",")]:
        point = _child(["train", str(rows), str(args.events), str(args.warmup)])
        results["training"].append(point)
        print(f"table rows {rows:>11,}: {point['events_per_s']:,.0f} events/s, "
              f"resident {point['rss_mib']:.0f} MiB", flush=True)
    results["load_after"] = os.getloadavg()
    print(where, f"load after {results['load_after'][0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
