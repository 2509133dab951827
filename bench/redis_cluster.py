"""Sparse tables on a Redis Cluster: memory per million rows, and a batch's latency.

Starts a private 3-primary cluster (``tests.services.RedisCluster``) and, for
comparison, a single redis-server, both on this machine.

Memory: admits ``--rows`` rows of one table through
:class:`~feature_store.sparse.cluster.ClusterSparseTable` (training pulls,
which write weights and state with ``SET ... NX PX``) and sums ``INFO
memory`` over the primaries before and after. The cluster layout's keys are
longer (the hash tag) and a cluster-mode Redis indexes every key by slot,
so a row costs a little more than on a single Redis (``bench.redis_memory``).

Latency: median time of a serving pull and of a training push of one
table's batch of ``--batch`` unique keys, single server vs cluster. On one
machine the three primaries share its cores, so this shows the cost of the
per-bucket grouping, not the gain of spreading load over machines.

    python -m bench.redis_cluster                      # 1M rows at dim 16, batches of 2,000
    python -m bench.redis_cluster --rows 200000 --dim 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import redis
from redis.cluster import RedisCluster as ClusterClient

from feature_store.settings import SparseSettings
from feature_store.sparse import ClusterSparseTable, RedisSparseTable, SparseTable, TableSpec
from tests.services import RedisCluster, RedisServer


def _used(clients: list[redis.Redis]) -> tuple[int, int]:
    infos = [c.info("memory") for c in clients]
    return sum(int(i["used_memory"]) for i in infos), sum(int(i["used_memory_rss"]) for i in infos)


def memory(rows: int, dim: int) -> dict[str, float]:
    with RedisCluster() as cluster:
        client = ClusterClient.from_url(cluster.url)
        nodes = [redis.Redis(port=p) for p in cluster.ports]
        try:
            table = ClusterSparseTable(TableSpec("video", dim, "adagrad"), SparseSettings(), client)
            rng = np.random.default_rng(dim)
            keys = np.unique(rng.integers(1, 2**63, size=rows, dtype=np.uint64))
            before, before_rss = _used(nodes)
            started = time.perf_counter()
            for start in range(0, len(keys), 50_000):
                table.pull(keys[start : start + 50_000], train=True)
            elapsed = time.perf_counter() - started
            after, after_rss = _used(nodes)
            per_node = [int(n.dbsize()) for n in nodes]
        finally:
            client.close()
            for n in nodes:
                n.close()
    per_million = 1_000_000 / len(keys)
    return {
        "rows": len(keys),
        "keys_per_node": per_node,  # type: ignore[dict-item]
        "bytes_per_row": (after - before) / len(keys),
        "used_mib_per_million": (after - before) * per_million / 2**20,
        "rss_mib_per_million": (after_rss - before_rss) * per_million / 2**20,
        "admit_s": elapsed,
    }


def _timings(table: SparseTable, batch: int, rounds: int, dim: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    population = np.unique(rng.integers(1, 2**63, size=20 * batch, dtype=np.uint64))
    table.pull(population, train=True)
    pulls, pushes = [], []
    grads = np.full((batch, dim), 0.01, dtype=np.float32)
    for _ in range(rounds):
        keys = rng.choice(population, size=batch, replace=False)
        started = time.perf_counter()
        table.pull(keys)
        pulls.append(time.perf_counter() - started)
        started = time.perf_counter()
        table.push(keys, grads)
        pushes.append(time.perf_counter() - started)
    return 1000 * statistics.median(pulls), 1000 * statistics.median(pushes)


def latency(batch: int, dim: int, rounds: int) -> dict[str, tuple[float, float]]:
    spec, settings = TableSpec("video", dim, "adagrad"), SparseSettings()
    out = {}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        out["single"] = _timings(RedisSparseTable(spec, settings, client), batch, rounds, dim)
        client.close()
    with RedisCluster() as cluster:
        cclient = ClusterClient.from_url(cluster.url)
        out["cluster"] = _timings(ClusterSparseTable(spec, settings, cclient), batch, rounds, dim)
        cclient.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2_000, help="unique keys per pull/push")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    m = memory(args.rows, args.dim)
    print(
        f"cluster, 3 primaries, dim {args.dim} Adagrad, {m['rows']} rows "
        f"(keys per node {m['keys_per_node']}): {m['bytes_per_row']:.0f} B/row, "
        f"used {m['used_mib_per_million']:.0f} MiB and RSS {m['rss_mib_per_million']:.0f} MiB "
        f"per million rows; admitted in {m['admit_s']:.1f} s"
    )
    for name, (pull_ms, push_ms) in latency(args.batch, args.dim, args.rounds).items():
        print(
            f"{name:>8}: batch of {args.batch} keys, pull {pull_ms:.2f} ms, push {push_ms:.2f} ms "
            "(median)"
        )


if __name__ == "__main__":
    main()
