"""Where ``vidrec eval``'s replay spends its CPU, per phase, and the figures it gives.

    python -m bench.eval_phases DATASET [--catalog VIDEOS] [--settings JSON]

Runs what :mod:`bench.screen_loo` runs (``--protocol loo --negatives 1``, the
replay only: :func:`app.evaluation.runner.prepare` and its ``_Online`` pass),
with the main thread's CPU split by phase: the trainer (``drain``), the signal
feed, the exports (export and the service's load), the questions
(``recommend`` and what the runner does around it) and the rest. It prints one
JSON line: the phases' CPU seconds and counts, the service's and the ranker's
HR@10 / NDCG@10 and the online AUC on the last 20% (the same figures as
``vidrec eval``'s rows), so two schedules can be compared on the same log, back
to back. Thread CPU (``time.thread_time``): another process on the same cores
counts less than in wall time, but still some (caches, frequency).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from app.evaluation import runner
from app.signal_feed import SignalFeed
from app.wiring import eval_trainers
from bench.screen_loo import replay_figures
from feature_store.runtime.resources import open_resources


class Phases:
    """Thread CPU and calls per phase name."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Time every call of ``owner.name`` (a class or an instance) as ``phase``."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu[phase] += time.thread_time() - t0
                self.calls[phase] += 1

        setattr(owner, name, timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--catalog", type=Path, default=None)
    p.add_argument("--settings", default="{}", help="settings sections (JSON) merged over eval's")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    phases = Phases()
    cfg = runner.EvalConfig(args.dataset, protocol="loo", negatives=1, progress=False,
                            catalog=args.catalog, settings=json.loads(args.settings),
                            limit=args.limit)
    replay_factory = eval_trainers().replay

    def replay(resources: Any) -> Any:
        handle = replay_factory(resources)
        phases.wrap(handle, "drain", "trainer")
        phases.wrap(handle, "export", "export")
        original = handle.loop.train

        def train(batch: Any) -> Any:
            phases.calls["steps" if batch.records else "idle steps"] += 1
            return original(batch)

        handle.loop.train = train
        return handle

    phases.wrap(SignalFeed, "step", "feed")
    phases.wrap(runner._Online, "_ask", "questions")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidrec-phases-") as tmp:
        t0 = time.thread_time()
        stream, settings, queries = runner.prepare(cfg, Path(tmp))
        phases.cpu["prepare"] = time.thread_time() - t0
        with open_resources(settings) as resources:
            resources.catalog.upsert(stream.videos)
            online = runner._Online(cfg, stream, resources, replay)
            t0 = time.thread_time()
            samples = online.run(queries)
            replay_cpu = time.thread_time() - t0
    timed = sum(v for k, v in phases.cpu.items() if k != "prepare")
    phases.cpu["replay, other"] = replay_cpu - timed
    print(json.dumps({
        "dataset": str(args.dataset), "settings": cfg.settings, "events": len(stream.events),
        "questions": len(queries), **replay_figures(samples, queries),
        "weighted_samples": int((samples.weights > 0).sum()),
        "phases_cpu_s": {k: round(v, 2) for k, v in phases.cpu.items()},
        "calls": dict(phases.calls),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }))


if __name__ == "__main__":
    main()
