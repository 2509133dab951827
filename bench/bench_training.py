"""Online training throughput (events/s) beside the floor of the bare model.

    python -m bench.bench_training [--events 150000] [--warmup 30000] [--batch 1024]
                                   [--backends memory,redis] [--threads 0]
                                   [--redis-url redis://...]

For each sparse backend, a fresh trainer (``OnlineTrainer.run`` in a thread,
exactly as ``vidrec up`` runs it) consumes a pre-filled in-process event log
of synthetic events (``feature_store.sim.world``, seed 0; catalog and
activity in the memory stores) in batches of ``--batch`` events. The figure
is events consumed per second between the ``--warmup``-th event and the
``--events``-th, so it counts everything a batch costs: polling and decoding,
dedupe, joining and labelling, store reads, feature extraction, pull,
forward, backward, push, the dense step, recording the activity, and the
loop's periodic metrics. Checkpoints and exports are off (they are
periodic, not per event). The log holds one batch more than ``--events``,
so the last measured batch is a full one: a finite stream that ended
mid-batch would have the trainer wait ``max_wait_ms`` (200 ms, ~4% of the
window) for events that never come, which is no cost of training.

The floor is the model alone: forward, loss, backward and the Adam step of
the same ``WideDeep`` on tensors pre-built from real batches of the same
stream (no pulls or pushes), as events per second (events in those batches
over the time). ``ratio`` is floor time over pipeline time per event: the
share of the pipeline's time the model itself would need.

Without ``--redis-url`` a private ``redis-server`` is started on a free port
(``tests.services.RedisServer``) and stopped at the end.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from bench.machine import cpu_model
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld, WorldConfig
from feature_store.sparse.snapshot import SnapshotData
from trainer.loop import OnlineTrainer
from trainer.samples import Lookup, labelled_rows
from trainer.step import to_inputs


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu": cpu_model(platform.processor() or platform.machine()),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def _settings(data_dir: Path, backend: str, batch: int, threads: int,
              redis_url: str | None) -> Settings:
    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "sparse": {"backend": backend},
        "trainer": {
            "batch_size": batch,
            "max_wait_ms": 200,
            "export_every_s": 0,
            "checkpoint_every_s": 1e9,
            "threads": threads,
        },
    }
    if redis_url is not None:
        overrides["redis"] = {"url": redis_url}
    return Settings(**overrides)


def pipeline_rate(settings: Settings, world: SyntheticWorld, events: list[Any], warmup: int,
                  measured: int | None = None, prefill_rows: int = 0) -> dict[str, float]:
    """Events/s of the real loop from ``warmup`` events to ``measured`` (default: all of
    ``events``); also samples/s and unique keys. ``prefill_rows`` extra rows (random
    keys, spread evenly over the tables) are loaded first, as old keys would be."""
    end = len(events) if measured is None else measured
    with open_resources(settings) as resources:
        for table in resources.tables.values():
            table.clear()
        if prefill_rows:
            _prefill(resources.tables, prefill_rows)
        resources.catalog.upsert(world.videos())
        for start in range(0, len(events), 20_000):
            resources.event_log.produce(events[start : start + 20_000])
        trainer = OnlineTrainer(resources)
        thread = threading.Thread(target=trainer.run, daemon=True)
        thread.start()
        metrics = trainer.metrics
        while metrics.events_total < warmup:
            time.sleep(0.01)
        t0, e0, s0 = time.perf_counter(), metrics.events_total, metrics.samples_total
        k0, b0 = metrics.unique_keys_total, metrics.batches_total
        while metrics.events_total < end:
            time.sleep(0.01)
        t1, e1, s1 = time.perf_counter(), metrics.events_total, metrics.samples_total
        keys = (metrics.unique_keys_total - k0) / max(1, metrics.batches_total - b0)
        trainer.request_stop()
        thread.join()
        window = metrics.window()
        for table in resources.tables.values():
            table.clear()
    return {
        "events_per_s": (e1 - e0) / (t1 - t0),
        "samples_per_s": (s1 - s0) / (t1 - t0),
        "unique_keys": float(keys),
        "auc": window["auc"],
    }


def _prefill(tables: dict[str, Any], rows: int) -> None:
    """Load ``rows`` rows of random keys, split evenly over ``tables`` (memory backend)."""
    rng = np.random.default_rng(7)
    share = rows // len(tables)
    for table in tables.values():
        keys = np.unique(rng.integers(1, 2**63, size=share, dtype=np.uint64))
        spec = table.spec
        table.load(SnapshotData(
            spec=spec,
            keys=keys,
            weights=rng.uniform(-0.05, 0.05, size=(len(keys), spec.dim)).astype(np.float32),
            state=np.full((len(keys), table.state_width), 0.1, dtype=np.float32),
            updated_at=np.full(len(keys), time.time()),
        ))


def _moments(trainer: Any, chunk: list[Any], lookup: Any, positions: list[int]) -> Any:
    return trainer.stages.join.moments([chunk[i] for i in positions], lookup)


def floor_rate(settings: Settings, world: SyntheticWorld, events: list[Any], batch: int,
               repeats: int = 30) -> float:
    """Events/s of forward + backward + Adam alone on pre-built tensors of real batches."""
    with open_resources(settings.model_copy(update={"data_dir": settings.data_dir / "floor"})
                        ) as resources:
        resources.catalog.upsert(world.videos())
        trainer = OnlineTrainer(resources)
        ranker = trainer.stages.rank.ranker
        prepared = []
        chunks = [events[i : i + batch] for i in range(0, len(events), batch)][:repeats + 10]
        for chunk in chunks:
            partitions = [0] * len(chunk)
            lookup = Lookup(resources.catalog, chunk)
            samples = trainer.stages.join.joiner.observe(
                chunk, partitions, lookup.durations,
                partial(_moments, trainer, chunk, lookup),
            )
            if samples:
                rows = labelled_rows(samples, ranker.extractor.layout)
                feats = rows.values.to_batch()
                tables, wide = ranker.pull(feats, train=True)
                prepared.append((len(chunk), feats, tables, wide, rows.labels, rows.weights))
            resources.activity.record(chunk, lookup.videos)
        prepared = prepared[-repeats:]
        model, optimizer, schema = trainer.model, ranker.optimizer, trainer.schema
        tensors = [(n, to_inputs(schema, f, t, w, requires_grad=True),
                    torch.from_numpy(y), torch.from_numpy(wt))
                   for n, f, t, w, y, wt in prepared]

        def once(inputs: list[torch.Tensor], y: torch.Tensor, wt: torch.Tensor) -> None:
            for x in inputs:
                x.grad = None
            logits = model.logits(*inputs)
            loss = functional.binary_cross_entropy_with_logits(logits, y, weight=wt,
                                                               reduction="sum")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for _, inputs, y, wt in tensors[:3]:
            once(inputs, y, wt)
        start = time.perf_counter()
        for _, inputs, y, wt in tensors:
            once(inputs, y, wt)
        elapsed = time.perf_counter() - start
        return sum(n for n, *_ in tensors) / elapsed


def run(
    *,
    events: int = 150_000,
    warmup: int = 30_000,
    batch: int = 1024,
    backends: tuple[str, ...] = ("memory", "redis"),
    threads: int = 1,
    redis_url: str | None = None,
) -> list[dict[str, Any]]:
    """Measure; one dict per figure: ``figure``, ``value`` and ``floor`` (events/s),
    ``ratio`` (floor time / pipeline time), ``unit``, ``note``."""
    logging.getLogger("trainer").setLevel(logging.WARNING)
    if threads:
        torch.set_num_threads(threads)
    world = SyntheticWorld(WorldConfig(users=20_000, videos=50_000, creators=2_000, seed=0))
    stream = world.events(events + batch)  # one batch past the window: see the module doc
    results: list[dict[str, Any]] = []
    server = None
    with tempfile.TemporaryDirectory(prefix="vidrec-bench-") as tmp:
        floor = floor_rate(_settings(Path(tmp), "memory", batch, threads, None), world, stream,
                           batch)
        for backend in backends:
            url = redis_url
            if backend == "redis" and url is None:
                from tests.services import RedisServer

                server = RedisServer()
                server.start()
                url = server.url
            try:
                settings = _settings(Path(tmp) / backend, backend, batch, threads, url)
                figures = pipeline_rate(settings, SyntheticWorld(world.config), stream, warmup,
                                        measured=events)
            finally:
                if server is not None:
                    server.stop()
                    server = None
            rate = figures["events_per_s"]
            results.append({
                "figure": f"train events/s, {backend} tables",
                "value": rate,
                "floor": floor,
                "ratio": rate / floor,
                "unit": "events/s",
                "note": (f"batch {batch}; {figures['samples_per_s']:,.0f} samples/s; "
                         f"~{figures['unique_keys']:,.0f} unique keys/batch; "
                         f"prequential AUC {figures['auc']:.3f}"),
            })
    return results


def _format(results: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | events/s | floor events/s | pipeline / floor | note |",
        "|---|---:|---:|---:|---|",
    ]
    for row in results:
        lines.append(
            f"| {row['figure']} | {row['value']:,.0f} | {row['floor']:,.0f} | "
            f"{row['ratio']:.2f} | {row['note']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=150_000)
    parser.add_argument("--warmup", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--backends", default="memory,redis")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = run(
        events=args.events, warmup=args.warmup, batch=args.batch,
        backends=tuple(args.backends.split(",")), threads=args.threads, redis_url=args.redis_url,
    )
    print({**machine(), "load_average_before": load_before})
    print(_format(results))


if __name__ == "__main__":
    main()
