"""The hand-written cluster table against redis-py's own cluster pipeline, same cluster.

    python -m bench.bench_cluster [--batch 2000] [--dim 16] [--rounds 40] [--rows 40000]

Starts a private 3-primary Redis Cluster (``tests.services.RedisCluster``) on
this machine and times, on the same table, the same keys and the same
optimizer, a batch's serving pull and training push through:

- ``hand-written``: :class:`~feature_store.sparse.cluster.ClusterSparseTable`
  (numpy-packed RESP per hash-tag bucket, one write per node, every node's
  replies read after all are sent; writes in ``MULTI``/``EXEC`` per bucket);
- ``redis-py``: the same key layout through redis-py's
  :class:`~redis.cluster.ClusterPipeline` (one ``GET`` per row: its cluster
  pipeline refuses ``MGET`` even within one slot; one ``SET ... PX`` per row;
  ``execute()`` per round trip; redis-py packs the commands, routes them by
  slot and follows redirects itself).

Each figure is the median over ``--rounds`` alternated rounds (hand-written,
then redis-py, on the same batch), after two warm-up rounds; both read what
they write (the pull results are checked equal). On one machine the three
primaries share its cores, so this measures the client's cost, which is
what the two differ in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from redis.cluster import RedisCluster as ClusterClient

from feature_store.constants import SPARSE_CLUSTER_BUCKETS
from feature_store.settings import SparseSettings
from feature_store.sparse import ClusterSparseTable, TableSpec
from feature_store.sparse.base import Keys, Rows
from feature_store.sparse.resp import key_bytes, split_rows, value_bytes
from tests.services import RedisCluster


class PipelineTable:
    """``pull``/``push`` of a :class:`ClusterSparseTable`'s rows through redis-py's pipeline.

    Same keys, values, optimizer and TTL as ``table``; no admission (the
    benchmark's keys are all admitted beforehand).
    """

    def __init__(self, table: ClusterSparseTable, client: ClusterClient) -> None:
        self.table = table
        self.client = client

    def _names(self, keys: Keys) -> tuple[list[np.ndarray], list[list[bytes]]]:
        buckets = (keys % np.uint64(SPARSE_CLUSTER_BUCKETS)).astype(np.intp)
        kb = key_bytes(keys)
        at, names = [], []
        for bucket in np.unique(buckets):
            index = np.flatnonzero(buckets == bucket)
            prefix = self.table._r[bucket].prefix  # noqa: SLF001 - the same layout
            at.append(index)
            names.append([prefix + kb[i].tobytes() for i in index])
        return at, names

    def _read(self, keys: Keys) -> tuple[list[np.ndarray], list[list[bytes]], Rows, Rows]:
        at, names = self._names(keys)
        pipe = self.client.pipeline()
        for group in names:
            for name in group:  # redis-py's cluster pipeline refuses MGET, even within a slot
                pipe.get(name)
        replies = pipe.execute()
        t = self.table
        weights = np.zeros((len(keys), t.spec.dim), dtype=np.float32)
        state = np.zeros((len(keys), t.state_width), dtype=np.float32)
        start = 0
        for index in at:
            reply = replies[start : start + len(index)]
            start += len(index)
            w, s, _ = split_rows(reply, t.spec.dim, t.state_width, "pipeline", t._r[0])  # noqa: SLF001
            weights[index], state[index] = w, s
        return at, names, weights, state

    def pull(self, keys: Keys) -> Rows:
        return self._read(keys)[2]

    def push(self, keys: Keys, grads: Rows) -> None:
        at, names, weights, state = self._read(keys)
        new_w, new_s = self.table.optimizer.apply(weights, state, grads)
        raw = value_bytes(new_w, new_s)
        ttl_ms = self.table._ttl_ms  # noqa: SLF001
        pipe = self.client.pipeline()
        for index, group in zip(at, names, strict=True):
            for i, name in zip(index.tolist(), group, strict=True):
                pipe.set(name, raw[i].tobytes(), px=ttl_ms)
        pipe.execute()


def run(batch: int, dim: int, rounds: int, rows: int) -> dict[str, dict[str, float]]:
    spec, settings = TableSpec("video", dim, "adagrad"), SparseSettings()
    times: dict[str, dict[str, list[float]]] = {
        name: {"pull": [], "push": []} for name in ("hand-written", "redis-py")
    }
    with RedisCluster() as cluster:
        client = ClusterClient.from_url(cluster.url)
        try:
            table = ClusterSparseTable(spec, settings, client)
            other = PipelineTable(table, client)
            rng = np.random.default_rng(1)
            population = np.unique(rng.integers(1, 2**63, size=rows, dtype=np.uint64))
            for start in range(0, len(population), 10_000):
                table.pull(population[start : start + 10_000], train=True)
            grads = np.full((batch, dim), 0.01, dtype=np.float32)
            for round_no in range(rounds + 2):
                keys = rng.choice(population, size=batch, replace=False)
                mine = table.pull(keys)
                theirs = other.pull(keys)
                if not np.array_equal(mine, theirs):
                    raise AssertionError("the two clients read different rows")
                for name, impl in (("hand-written", table), ("redis-py", other)):
                    started = time.perf_counter()
                    impl.pull(keys)
                    pulled = time.perf_counter() - started
                    started = time.perf_counter()
                    impl.push(keys, grads)
                    pushed = time.perf_counter() - started
                    if round_no >= 2:
                        times[name]["pull"].append(pulled)
                        times[name]["push"].append(pushed)
        finally:
            client.close()
    return {
        name: {op: 1000 * statistics.median(values) for op, values in ops.items()}
        for name, ops in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2_000, help="unique keys per pull/push")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rows", type=int, default=40_000, help="rows admitted beforehand")
    args = parser.parse_args()
    results = run(args.batch, args.dim, args.rounds, args.rows)
    print(
        f"3-primary cluster, one table dim {args.dim} Adagrad, batches of {args.batch} keys, "
        f"median of {args.rounds} alternated rounds, load {os.getloadavg()[0]:.1f}"
    )
    base = results["redis-py"]
    for name, ops in results.items():
        print(
            f"{name:>13}: pull {ops['pull']:7.2f} ms ({ops['pull'] / base['pull']:.2f}x), "
            f"push {ops['push']:7.2f} ms ({ops['push'] / base['push']:.2f}x)"
        )


if __name__ == "__main__":
    main()
