"""Two trees' in-process recommends taking turns: thread CPU per request, paired.

    python bench/ab_requests.py BEFORE_TREE AFTER_TREE [--rounds 30] [--requests 100]
                                [--answers]

For a change to the request path on a shared machine, where whole benchmark
runs of the same code differ by more than the change: prepares the serving
benchmark's world once (``bench_serving.prepare``: 5,000 videos, 50,000
events, an exported model with towers; memory backends), then starts one
long-lived worker process per tree (this script with ``--worker``, its
working directory the tree, so it imports that tree's ``app``), each on its
own copy of the world. The workers take turns, ``--requests`` recommends of
one kind at a time (500 given candidates, then retrieval), swapping the
order every round, for ``--rounds`` rounds. A request is what the route
does in-process: parse the JSON body, ``Recommender.recommend``, dump the
response. Per tree and kind: the thread CPU per request (mean, median of
the rounds) and the median of the rounds' wall p50; the paired difference
(after minus before) is the median over rounds of the two turns of one round,
which took place seconds apart under the same load.

``--answers`` instead checks that the trees answer the same: exploration
off, the served log off, a fixed clock; every given and 50 retrieval
requests; each response's JSON without its ``recommendation_id`` and each
score's ``repr`` compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("given", "retrieval")
FIXED_CLOCK_S = 1_800_000_000.0


def bodies_of(world: Path) -> dict[str, list[bytes]]:
    given = json.loads((world / "requests.json").read_text())
    retrieval = [{"user_id": b["user_id"], "count": 20, "context": b["context"]} for b in given]
    return {"given": [json.dumps(b).encode() for b in given],
            "retrieval": [json.dumps(b).encode() for b in retrieval]}


def worker(world: Path, answers: bool) -> None:
    """Serve ``KIND N`` lines on stdin with ``{"cpu": ms, "p50": ms}`` lines (the tree of
    the working directory); with ``answers``, print the answers once and end."""
    sys.path.insert(0, os.getcwd())
    from app.api.recommend import parse_request
    from app.service import open_service
    from bench.bench_serving import bench_settings
    from feature_store.runtime.resources import open_resources
    from feature_store.settings import Settings

    data = Path(tempfile.mkdtemp(prefix="vidrec-ab-")) / "data"
    shutil.copytree(world / "data", data)
    raw = bodies_of(world)
    settings = bench_settings(data, "memory", None)
    if answers:
        base = settings.model_dump()
        base["rerank"] |= {"exploration_budget": 0.0, "prior_refresh_s": 1e9}
        base["served_log"] |= {"enabled": False}
        settings = Settings.model_validate(base)
    try:
        with open_resources(settings) as resources, open_service(resources) as service:
            recommender = service.recommender

            def one(body: bytes) -> Any:
                return recommender.recommend(parse_request("application/json", body))

            if answers:
                recommender.clock = lambda: FIXED_CLOCK_S
                out = []
                for body in raw["given"] + raw["retrieval"][:50]:
                    response = one(body)
                    page = json.loads(response.model_dump_json())
                    page.pop("recommendation_id")
                    out.append([page, [repr(item.score) for item in response.items]])
                print(json.dumps(out), flush=True)
                return
            for kind in KINDS:  # warm
                for body in raw[kind] * 2:
                    one(body).model_dump_json()
            print("ready", flush=True)
            position = dict.fromkeys(KINDS, 0)
            for line in sys.stdin:
                kind, n = line.split()
                bodies, walls = raw[kind], []
                began = time.thread_time()
                for i in range(int(n)):
                    wall = time.perf_counter()
                    one(bodies[(position[kind] + i) % len(bodies)]).model_dump_json()
                    walls.append(time.perf_counter() - wall)
                cpu_ms = (time.thread_time() - began) * 1000 / int(n)
                position[kind] += int(n)
                print(json.dumps({"cpu": cpu_ms, "p50": statistics.median(walls) * 1000}),
                      flush=True)
    finally:
        shutil.rmtree(data.parent, ignore_errors=True)


def start(tree: Path, world: Path, answers: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(world)]
        + (["--answers"] if answers else []),
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def same_answers(trees: list[Path], world: Path) -> bool:
    outputs = []
    for tree in trees:
        process = start(tree, world, answers=True)
        out, _ = process.communicate()
        outputs.append(out.strip().splitlines()[-1])
    same = outputs[0] == outputs[1]
    print(f"{len(json.loads(outputs[0]))} answers, identical: {same}")
    return same


def take_turns(trees: list[Path], world: Path, rounds: int, n: int) -> dict[str, Any]:
    workers = {tree: start(tree, world, answers=False) for tree in trees}
    for process in workers.values():
        assert process.stdout is not None
        while process.stdout.readline().strip() != "ready":
            pass
    load, began = os.getloadavg()[0], time.strftime("%H:%M", time.gmtime())
    turns: dict[str, dict[Path, list[dict[str, float]]]] = {
        kind: {tree: [] for tree in trees} for kind in KINDS}
    for r in range(rounds):
        for kind in KINDS:
            for tree in trees if r % 2 == 0 else trees[::-1]:
                process = workers[tree]
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(f"{kind} {n}\n")
                process.stdin.flush()
                turns[kind][tree].append(json.loads(process.stdout.readline()))
    for process in workers.values():
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    out: dict[str, Any] = {"utc": [began, time.strftime("%H:%M", time.gmtime())],
                           "load": [round(load, 2), round(os.getloadavg()[0], 2)],
                           "rounds": rounds, "requests": n}
    before, after = trees
    for kind in KINDS:
        row: dict[str, Any] = {}
        for name, tree in (("before", before), ("after", after)):
            cpu = [t["cpu"] for t in turns[kind][tree]]
            row[name] = {"cpu_mean_ms": round(statistics.mean(cpu), 3),
                         "cpu_median_ms": round(statistics.median(cpu), 3),
                         "wall_p50_ms": round(statistics.median(
                             t["p50"] for t in turns[kind][tree]), 3)}
        row["paired_cpu_diff_ms"] = round(statistics.median(
            a["cpu"] - b["cpu"] for b, a in zip(turns[kind][before], turns[kind][after],
                                                strict=True)), 3)
        out[kind] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path, help="BEFORE_TREE AFTER_TREE")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--answers", action="store_true", help="check the answers instead")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.answers)
        return 0
    if len(args.trees) != 2:
        parser.error("give two trees: BEFORE_TREE AFTER_TREE")
    trees = [tree.resolve() for tree in args.trees]
    world = Path(tempfile.mkdtemp(prefix="vidrec-ab-world-"))
    try:
        sys.path.insert(0, str(trees[1]))
        from bench.bench_serving import (
            DISTINCT_REQUESTS,
            bench_settings,
            make_requests,
            prepare,
        )

        requests = make_requests(DISTINCT_REQUESTS, 500)
        prepare(bench_settings(world / "data", "memory", None), requests)
        (world / "requests.json").write_text(json.dumps(requests))
        if args.answers:
            return 0 if same_answers(trees, world) else 1
        print(json.dumps(take_turns(trees, world, args.rounds, args.requests), indent=2))
    finally:
        shutil.rmtree(world, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
