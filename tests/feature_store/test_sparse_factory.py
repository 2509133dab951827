"""Opening tables from settings, and the per-model container."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import redis

from feature_store.errors import ConfigurationError, SparseTableUnavailable
from feature_store.settings import RedisSettings, load_settings
from feature_store.sparse import (
    ClusterSparseTable,
    MemorySparseTable,
    RedisSparseTable,
    SparseTable,
    SparseTables,
    TableSpec,
    connect_redis,
    open_table,
)

SPECS = [TableSpec("video", 8, "adagrad"), TableSpec("wide", 1, "ftrl")]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def settings(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        return load_settings(sparse={"backend": "memory"})
    url = request.getfixturevalue("redis_url")
    return load_settings(sparse={"backend": "redis"}, redis={"url": url, "batch_chunk": 128})


def test_open_table_picks_the_backend(settings) -> None:  # type: ignore[no-untyped-def]
    table = open_table(SPECS[0], settings)
    expected = MemorySparseTable if settings.sparse.backend == "memory" else RedisSparseTable
    assert isinstance(table, expected) and isinstance(table, SparseTable)
    table.pull(np.arange(300, dtype=np.uint64), train=True)
    assert table.stats().rows == 300
    table.clear()
    table.close()


def test_tables_snapshot_and_restore_together(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = np.arange(1, 101, dtype=np.uint64)
    with SparseTables.open(SPECS, settings) as tables:
        assert sorted(tables) == ["video", "wide"] and len(tables) == 2
        for table in tables.values():
            table.pull(keys, train=True)
            table.push(keys, np.ones((100, table.spec.dim), dtype=np.float32))
        before = {name: t.pull(keys) for name, t in tables.items()}
        tables.snapshot_all(tmp_path)
        for table in tables.values():
            table.clear()
        assert tables.restore_all(tmp_path) == {"video": 100, "wide": 100}
        for name, table in tables.items():
            assert table.pull(keys).tobytes() == before[name].tobytes()
        assert tables.expire_all() == 0
        for table in tables.values():
            table.clear()


@pytest.mark.redis
def test_owned_client_is_closed_with_the_container(redis_url: str) -> None:
    observer = redis.Redis.from_url(redis_url)
    baseline = len(observer.client_list())
    settings = load_settings(sparse={"backend": "redis"}, redis={"url": redis_url})
    tables = SparseTables.open(SPECS, settings)
    tables["video"].pull(np.array([1], dtype=np.uint64))
    assert len(observer.client_list()) == baseline + 1
    tables.close()
    deadline = time.monotonic() + 2
    while len(observer.client_list()) > baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(observer.client_list()) == baseline, "the container's own connection is closed"
    observer.close()


@pytest.mark.redis
def test_borrowed_client_is_left_open(redis_url: str) -> None:
    settings = load_settings(sparse={"backend": "redis"}, redis={"url": redis_url})
    client = redis.Redis.from_url(redis_url)
    with SparseTables.open(SPECS, settings, redis_client=client) as tables:
        tables["wide"].pull(np.array([1], dtype=np.uint64))
    assert client.ping()
    client.close()


@pytest.mark.redis
def test_cluster_settings_open_cluster_tables(redis_cluster_url: str) -> None:
    settings = load_settings(
        sparse={"backend": "redis"}, redis={"url": redis_cluster_url, "cluster": True}
    )
    with SparseTables.open(SPECS, settings) as tables:
        assert all(isinstance(t, ClusterSparseTable) for t in tables.values())
        keys = np.arange(1, 500, dtype=np.uint64)
        tables["video"].pull(keys, train=True)
        assert tables["video"].stats().rows == len(keys)


def test_an_unreachable_cluster_fails_clearly() -> None:
    with pytest.raises(SparseTableUnavailable, match="Redis Cluster"):
        connect_redis(RedisSettings(url="redis://127.0.0.1:1/0", cluster=True))


def test_duplicate_names_are_refused() -> None:
    settings = load_settings()
    with pytest.raises(ConfigurationError, match="two sparse tables"):
        SparseTables.open([SPECS[0], SPECS[0]], settings)


@pytest.mark.redis
def test_more_readers_than_connections_wait_for_one_instead_of_failing(redis_url: str) -> None:
    """Eight threads, each holding a connection of a 2-connection pool while another round
    would start: they take turns (redis-py's plain pool refused the third at once with
    "Too many connections", which the demo met as degraded answers); a connection that
    never frees up is the backend unavailable after ``socket_timeout_s``, not a hang."""
    import threading

    from feature_store.sparse.resp import borrowed

    client = connect_redis(RedisSettings(url=redis_url, max_connections=2, socket_timeout_s=5))
    pool = client.connection_pool
    inside, errors = [], []
    both_out = threading.Barrier(2, timeout=5)

    def read(k: int) -> None:
        try:
            with borrowed(pool, SparseTableUnavailable, "test") as conn:
                conn.send_command("PING")
                assert conn.read_response() in (b"PONG", "PONG")
                inside.append(k)
                if k < 2:
                    both_out.wait()  # the first two hold both connections at once
        except Exception as exc:  # noqa: BLE001 - what failed is what the test reports
            errors.append(repr(exc))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for thread in threads[:2]:
        thread.start()
    for thread in threads[2:]:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and sorted(inside) == list(range(8))

    starved = connect_redis(RedisSettings(url=redis_url, max_connections=1, socket_timeout_s=0.2))
    with borrowed(starved.connection_pool, SparseTableUnavailable, "holder"):
        with pytest.raises(SparseTableUnavailable):
            with borrowed(starved.connection_pool, SparseTableUnavailable, "waiter"):
                pass
    client.close()
    starved.close()
