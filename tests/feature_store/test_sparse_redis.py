"""What only the Redis backend has: its wire layout, chunking, errors and clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_store.constants import SPARSE_ROWS, sparse_prefix
from feature_store.errors import ConfigurationError, SparseTableUnavailable
from feature_store.settings import SparseSettings
from feature_store.sparse import RedisSparseTable, TableSpec
from tests.services import free_port

pytestmark = pytest.mark.redis

SPEC = TableSpec("emb", 4, "adam")


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_layout_one_binary_float32_key_per_row(client: redis.Redis) -> None:
    table = RedisSparseTable(SPEC, SparseSettings(model_name="m1", ttl_s=60), client)
    key = 0x0102030405060708
    weights = table.pull(np.array([key], dtype=np.uint64), train=True)
    name = sparse_prefix("m1", "emb", SPARSE_ROWS) + bytes([1, 2, 3, 4, 5, 6, 7, 8])
    value = client.get(name)
    assert value is not None and len(value) == 4 * (4 + 2 * 4 + 1), "weights then Adam state"
    assert value[:16] == weights.astype("<f4").tobytes()
    assert value[16:] == bytes(4 * (2 * 4 + 1)), "Adam state starts at zero"
    assert 59_000 < client.pttl(name) <= 60_000
    assert set(client.keys()) == {name}, "threshold 1 keeps no counters"
    table.push(np.array([key], dtype=np.uint64), np.ones((1, 4), dtype=np.float32))
    value = client.get(name)
    assert value is not None
    state = np.frombuffer(value[16:], dtype="<f4")
    assert state[-1] == 1.0, "the push wrote the state (Adam's step count) with the weights"
    np.testing.assert_array_equal(
        np.frombuffer(value[:16], dtype="<f4"), table.pull(np.array([key], dtype=np.uint64))[0]
    )
    assert 59_000 < client.pttl(name) <= 60_000, "a push refreshes the row's TTL"


def test_sighting_counters_carry_the_ttl(client: redis.Redis) -> None:
    table = RedisSparseTable(SPEC, SparseSettings(admission_threshold=5, ttl_s=30), client)
    table.pull(np.array([1, 2], dtype=np.uint64), train=True)
    names = client.keys()
    assert len(names) == 2 and all(b":c:" in name for name in names)
    assert all(client.get(name) == b"1" and 0 < client.pttl(name) <= 30_000 for name in names)


def test_chunks_smaller_than_the_batch(client: redis.Redis) -> None:
    table = RedisSparseTable(SPEC, SparseSettings(admission_threshold=2), client, chunk=64)
    keys = np.arange(1000, dtype=np.uint64) * 7919
    table.pull(keys, train=True)
    first = table.pull(keys, train=True)
    table.push(keys, np.ones((1000, 4), dtype=np.float32))
    assert table.stats().rows == 1000 and table.stats().admissions == 1000
    assert (table.pull(keys) < first).all()
    assert not client.keys(b"*:c:*"), "admitted keys' counters are deleted"


def test_unreachable_redis_raises_sparse_table_unavailable() -> None:
    # No connect retries: redis-py 8 otherwise backs off ~4 s per call before giving up.
    dead = redis.Redis(
        port=free_port(),
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    table = RedisSparseTable(SPEC, SparseSettings(), dead)
    keys = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(SparseTableUnavailable) as info:
        table.pull(keys)
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    assert info.value.http_status == 503
    for call in (
        lambda: table.pull(keys, train=True),
        lambda: table.push(keys, np.zeros((2, 4), dtype=np.float32)),
        table.stats,
        table.clear,
        table.export,
    ):
        with pytest.raises(SparseTableUnavailable):
            call()
    dead.close()


def test_server_gone_mid_session() -> None:
    from tests.services import RedisServer

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=1)
        table = RedisSparseTable(SPEC, SparseSettings(), client)
        keys = np.array([1], dtype=np.uint64)
        table.pull(keys, train=True)
        server.stop()
        with pytest.raises(SparseTableUnavailable):
            table.push(keys, np.zeros((1, 4), dtype=np.float32))
        client.close()


def test_foreign_bytes_under_the_prefix_are_an_error(client: redis.Redis) -> None:
    table = RedisSparseTable(SPEC, SparseSettings(), client)
    client.set(sparse_prefix("main", "emb", SPARSE_ROWS) + (5).to_bytes(8, "big"), b"short")
    with pytest.raises(SparseTableUnavailable, match="not 52 bytes"):
        table.pull(np.array([5], dtype=np.uint64))
    # The connection was dropped, not left mid-reply: the next call works.
    assert not table.pull(np.array([6], dtype=np.uint64)).any()


def test_refuses_clients_that_decode_replies(redis_url: str) -> None:
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisSparseTable(SPEC, SparseSettings(), decoding)
    decoding.close()


def test_borrowed_client_stays_open_owned_client_closes(redis_url: str) -> None:
    borrowed = redis.Redis.from_url(redis_url)
    with RedisSparseTable(SPEC, SparseSettings(), borrowed) as table:
        table.pull(np.array([1], dtype=np.uint64), train=True)
    assert borrowed.ping()
    borrowed.close()


def test_two_trainers_admitting_the_same_keys_agree(redis_url: str) -> None:
    """Admission writes with NX: a row another trainer created is never reset."""
    clients = [redis.Redis.from_url(redis_url) for _ in range(2)]
    tables = [RedisSparseTable(SPEC, SparseSettings(), c) for c in clients]
    keys = np.arange(1, 501, dtype=np.uint64)
    results: list[np.ndarray] = [np.empty(0), np.empty(0)]
    barrier = threading.Barrier(2)

    def admit(i: int) -> None:
        barrier.wait()
        results[i] = tables[i].pull(keys, train=True)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    np.testing.assert_array_equal(results[0], results[1])
    assert sum(t.stats().admissions for t in tables) == len(keys), "each row created once"
    for c in clients:
        c.close()


def test_a_refused_write_drops_the_connection_not_the_table(client: redis.Redis) -> None:
    """An error reply mid-pipeline leaves unread replies: that connection must not be reused."""
    table = RedisSparseTable(SPEC, SparseSettings(), client)
    table.pull(np.array([1, 2], dtype=np.uint64), train=True)
    bad = b"*1\r\n$3\r\nSET\r\n"  # refused: wrong number of arguments
    with pytest.raises(SparseTableUnavailable, match="wrong number of arguments"):
        with table._connection() as conn:  # noqa: SLF001
            conn.send_packed_command([bad * 3])
            table._replies(conn, 3)  # noqa: SLF001
    table.push(np.array([1, 2], dtype=np.uint64), np.ones((2, 4), dtype=np.float32))
    assert client.ping() and table.stats().rows == 2
