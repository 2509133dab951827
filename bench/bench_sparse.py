"""Throughput of the sparse tables beside the floor of raw redis-py.

    python -m bench.bench_sparse [--iterations 30] [--rows 100000] [--batch 4096] [--dim 64]
                                 [--redis-url redis://...]

Each figure is keys per second over batches of ``--batch`` unique keys drawn
(fixed seed) from a table pre-filled with ``--rows`` rows of ``--dim``
float32, the median of ``--iterations`` timed batches after two warm-ups:

- ``pull``: serving pull (``train=False``), weights only (for Redis, the
  row's value, weights then state, of which the state is dropped).
- ``push``: one gradient row per key, Adagrad (state as wide as the row);
  for Redis this is a read of each row (weights and state in one value),
  the optimizer and a pipelined ``SET ... PX`` of each row.

The floor is what redis-py does with the same bytes and no table logic,
measured in the same run against the same server: for ``pull`` one
pipelined ``MGET`` per ``batch_chunk`` keys; for ``push`` a pipelined
(``transaction=False``) ``SET`` of every row's value, plus, as a second
floor, that write preceded by the ``MGET`` read of the rows (the least a
read-modify-write can do). ``ratio`` is table time over floor time (below 1:
the table beats plain redis-py).

Without ``--redis-url`` a private ``redis-server`` is started on a free port
(``tests.services.RedisServer``) and stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis

from bench.machine import cpu_model
from feature_store.settings import SparseSettings
from feature_store.sparse import MemorySparseTable, RedisSparseTable, TableSpec

CHUNK = 8192


def _median_rate(fn: Callable[[int], object], keys_per_call: int, iterations: int) -> float:
    for i in range(2):
        fn(i)
    times = []
    for i in range(iterations):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return keys_per_call / statistics.median(times)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu": cpu_model(platform.processor() or platform.machine()),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "redis-py": redis.__version__,
    }


def _fill(table: Any, keys: np.ndarray, batch: int) -> None:
    for start in range(0, len(keys), batch):
        table.pull(keys[start : start + batch], train=True)


def _floors(
    client: redis.Redis, table: RedisSparseTable, batches: list[np.ndarray], iterations: int
) -> dict[str, float]:
    """Raw redis-py on the table's own keys and value sizes."""
    batch = len(batches[0])
    prefix = table._r.prefix  # noqa: SLF001 - same bytes on purpose
    names = [[prefix + int(k).to_bytes(8, "big") for k in keys] for keys in batches]
    value = bytes(4 * (table.spec.dim + table.state_width))

    def mget(names_list: list[bytes]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(names_list), CHUNK):
            pipe.mget(names_list[start : start + CHUNK])
        return pipe.execute()

    def read(i: int) -> None:
        mget(names[i % len(names)])

    def write(i: int) -> None:
        pipe = client.pipeline(transaction=False)
        for name in names[i % len(names)]:
            pipe.set(name, value, px=3_600_000)
        pipe.execute()

    def read_write(i: int) -> None:
        read(i)
        write(i)

    return {
        "pull": _median_rate(read, batch, iterations),
        "push": _median_rate(write, batch, iterations),
        "push_rw": _median_rate(read_write, batch, iterations),
    }


def _row(figure: str, value: float, floor: float | None, note: str) -> dict[str, Any]:
    """One result; ``ratio`` is table time over floor time (floor rate over table rate)."""
    return {
        "figure": figure,
        "value": value,
        "unit": "keys/s",
        "floor": floor,
        "ratio": None if floor is None else floor / value,
        "note": note,
    }


def run(
    *,
    iterations: int = 30,
    rows: int = 100_000,
    batch: int = 4096,
    dim: int = 64,
    redis_url: str | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Measure; one dict per figure: ``figure``, ``value`` and ``floor`` (keys/s),
    ``ratio`` (table time / floor time, None without a floor), ``unit``, ``note``."""
    rng = np.random.default_rng(seed)
    all_keys = np.unique(rng.integers(0, 2**64 - 1, size=rows, dtype=np.uint64))
    batches = [rng.choice(all_keys, size=batch, replace=False) for _ in range(iterations)]
    grads = rng.normal(0, 0.01, size=(batch, dim)).astype(np.float32)
    spec = TableSpec(name="bench", dim=dim, optimizer="adagrad")
    settings = SparseSettings(model_name="bench", ttl_s=3600)
    results: list[dict[str, Any]] = []

    memory = MemorySparseTable(spec, settings)
    _fill(memory, all_keys, batch)
    for figure, fn in (
        ("memory pull", lambda i: memory.pull(batches[i % len(batches)])),
        ("memory push", lambda i: memory.push(batches[i % len(batches)], grads)),
    ):
        results.append(_row(figure, _median_rate(fn, batch, iterations), None, "numpy, one thread"))

    server = None
    if redis_url is None:
        from tests.services import RedisServer

        server = RedisServer()
        server.start()
        redis_url = server.url
    client = redis.Redis.from_url(redis_url)
    try:
        note = f"redis-server {client.info('server').get('redis_version')}"
        table = RedisSparseTable(spec, settings, client, chunk=CHUNK)
        table.clear()
        table.load(memory.export())
        pull = _median_rate(lambda i: table.pull(batches[i % len(batches)]), batch, iterations)
        push = _median_rate(
            lambda i: table.push(batches[i % len(batches)], grads), batch, iterations
        )
        floors = _floors(client, table, batches, iterations)
        table.clear()
        for figure, value, floor in (
            ("redis pull", pull, floors["pull"]),
            ("redis push", push, floors["push"]),
            ("redis push vs read+write floor", push, floors["push_rw"]),
        ):
            results.append(_row(figure, value, floor, note))
    finally:
        client.close()
        if server is not None:
            server.stop()
    return results


def _format(results: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | keys/s | floor keys/s | table time / floor time | note |",
        "|---|---:|---:|---:|---|",
    ]
    for row in results:
        floor = "-" if row["floor"] is None else f"{row['floor']:,.0f}"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(
            f"| {row['figure']} | {row['value']:,.0f} | {floor} | {ratio} | {row['note']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    print(" ".join(f"{k}={v}" for k, v in machine().items()))
    print(
        f"rows={args.rows} batch={args.batch} dim={args.dim} iterations={args.iterations} "
        f"load average={os.getloadavg()[0]:.2f}"
    )
    results = run(
        iterations=args.iterations,
        rows=args.rows,
        batch=args.batch,
        dim=args.dim,
        redis_url=args.redis_url,
    )
    print(_format(results))


if __name__ == "__main__":
    main()
