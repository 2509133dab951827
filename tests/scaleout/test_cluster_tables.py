"""What only a cluster does to the sparse tables: spread, and slots that move."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster

from feature_store.constants import SPARSE_CLUSTER_BUCKETS
from feature_store.settings import SparseSettings
from feature_store.sparse import ClusterSparseTable, TableSpec

pytestmark = pytest.mark.redis

SETTINGS = SparseSettings(adagrad_initial_accumulator=0.5, learning_rate=0.05)
SPEC = TableSpec("emb", 8, "adagrad")


@pytest.fixture()
def cluster(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    yield client
    client.close()


def _node_clients(cluster: RedisCluster) -> dict[str, redis.Redis]:
    return {n.name: n.redis_connection for n in cluster.get_primaries()}  # type: ignore[misc]


def _move_slot(cluster: RedisCluster, slot: int, names: list[bytes]) -> None:
    """Move ``slot`` with its keys ``names`` to another primary, as ``redis-cli --cluster
    reshard`` does (names given: redis-py decodes ``CLUSTER GETKEYSINSLOT``'s binary names)."""
    nodes = _node_clients(cluster)
    ids = {name: client.execute_command("CLUSTER MYID") for name, client in nodes.items()}
    source = cluster.nodes_manager.get_node_from_slot(slot).name
    target = next(name for name in nodes if name != source)
    src, dst = nodes[source], nodes[target]
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
    host, port = target.rsplit(":", 1)
    src.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *names)
    assert src.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
    for client in nodes.values():
        client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])


def test_rows_spread_over_every_node_and_each_bucket_stays_on_one(cluster: RedisCluster) -> None:
    table = ClusterSparseTable(SPEC, SETTINGS, cluster)
    keys = np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    table.pull(keys, train=True)
    per_node = {name: client.dbsize() for name, client in _node_clients(cluster).items()}
    assert all(count > 0 for count in per_node.values()), per_node
    assert sum(per_node.values()) == len(keys)  # one key per row: weights then state
    slots = {cluster.keyslot(table._r[b].prefix) for b in range(SPARSE_CLUSTER_BUCKETS)}
    assert len(slots) == SPARSE_CLUSTER_BUCKETS
    for b in range(SPARSE_CLUSTER_BUCKETS):  # rows and counters share a slot
        assert len({cluster.keyslot(k[b].prefix) for k in (table._r, table._c)}) == 1


def test_a_push_during_resharding_applies_each_gradient_once(cluster: RedisCluster) -> None:
    """A table with a stale slot map is redirected, refreshes, and resends only what
    was refused: every row takes each push exactly once."""
    table = ClusterSparseTable(SPEC, SETTINGS, cluster)
    other = RedisCluster.from_url(f"redis://{cluster.get_primaries()[0].name}/0")
    keys = np.arange(1, 3001, dtype=np.uint64)
    table.pull(keys, train=True)
    grads = np.ones((len(keys), SPEC.dim), dtype=np.float32)
    table.push(keys, grads)
    for bucket in (3, 17, 40):  # moved behind the table's back (another client)
        rows = [int(k).to_bytes(8, "big") for k in keys if k % SPARSE_CLUSTER_BUCKETS == bucket]
        names = [table._r[bucket].prefix + row for row in rows]
        _move_slot(other, cluster.keyslot(table._r[bucket].prefix), names)
    refreshes: list[int] = []
    initialize = cluster.nodes_manager.initialize

    def counted(*args: object, **kwargs: object) -> None:
        refreshes.append(1)
        initialize(*args, **kwargs)  # type: ignore[arg-type]

    cluster.nodes_manager.initialize = counted  # type: ignore[method-assign]
    table.push(keys, grads)
    table.push(keys, grads)
    assert refreshes, "the stale slot map was found out by a redirect"
    data = table.export()
    assert len(data.keys) == len(keys)
    steps = np.round(data.state - 0.5).astype(int)  # adagrad: one per push of gradient 1
    assert (steps == 3).all(), np.unique(steps, return_counts=True)
    assert np.isfinite(data.weights).all()
    other.close()
