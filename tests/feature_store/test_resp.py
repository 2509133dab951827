"""The RESP codec and the redis-py internals it leans on, pinned to one redis-py version.

:mod:`feature_store.sparse.resp` is the one module that reaches past
redis-py's documented surface (a connection's ``_parser``, a pool's
connections by hand, a cluster client's ``nodes_manager``). These tests fail
first when an upgrade moves any of it; re-check those uses, then move
``REDIS_PY_TESTED``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import redis
from redis.cluster import NodesManager
from redis.exceptions import RedisClusterException

from feature_store.errors import SparseTableUnavailable, StoreUnavailable
from feature_store.redis_errors import redis_errors
from feature_store.sparse.resp import (
    REDIS_PY_TESTED,
    Kind,
    borrowed,
    key_bytes,
    pack,
    read_replies,
    read_reply,
    value_bytes,
)
from tests.services import free_port


def test_redis_py_is_the_version_the_internals_were_checked_against() -> None:
    major_minor = ".".join(redis.__version__.split(".")[:2])
    assert major_minor == REDIS_PY_TESTED, (
        f"redis-py {redis.__version__}: re-check feature_store/sparse/resp.py's uses of "
        "its internals (Connection._parser, NodesManager), then set REDIS_PY_TESTED"
    )


def test_the_internals_are_where_the_codec_reaches_for_them() -> None:
    conn = redis.Redis().connection_pool.make_connection()  # not connected: no socket
    assert callable(getattr(conn._parser, "read_response", None))  # noqa: SLF001
    assert callable(NodesManager.get_node_from_slot) and callable(NodesManager.initialize)


def test_redis_errors_translates_every_family() -> None:
    for cause in (redis.ConnectionError("down"), RedisClusterException("no node"), OSError()):
        with pytest.raises(StoreUnavailable, match="catalog get failed") as caught:
            with redis_errors(StoreUnavailable, "catalog get failed"):
                raise cause
        assert caught.value.__cause__ is cause


def test_borrowed_names_an_unreachable_server() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    try:
        with pytest.raises(SparseTableUnavailable, match="t: Redis unreachable"):
            with borrowed(client.connection_pool, SparseTableUnavailable, "t"):
                pass
    finally:
        client.close()


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.mark.redis
def test_packed_records_are_commands_redis_understands(client: redis.Redis) -> None:
    kind = Kind(b"t:r:")
    kb = key_bytes(np.array([1, 2, 3], dtype=np.uint64))
    values = value_bytes(np.ones((3, 2), np.float32), np.zeros((3, 1), np.float32))
    with borrowed(client.connection_pool, SparseTableUnavailable, "t") as conn:
        conn.send_packed_command([kind.set(kb, values, 60_000), kind.mget(kb)])
        assert read_replies(conn, 3) == [b"OK"] * 3
        assert read_reply(conn) == [values[i].tobytes() for i in range(3)]
    assert 0 < client.pttl(b"t:r:" + kb[0].tobytes()) <= 60_000


@pytest.mark.redis
def test_borrowed_drops_a_connection_left_out_of_step(client: redis.Redis) -> None:
    with pytest.raises(SparseTableUnavailable, match="t: .*wrong number of arguments"):
        with borrowed(client.connection_pool, SparseTableUnavailable, "t") as conn:
            conn.send_packed_command([pack(b"SET") * 2, pack(b"PING")])
            read_replies(conn, 3)
    assert client.ping()  # the next borrower does not read the stale replies


class _NoParser:
    """A connection seen through ``read_response`` only (no ``_parser``)."""

    def __init__(self, conn: object) -> None:
        self.read_response = conn.read_response  # type: ignore[attr-defined]


@pytest.mark.redis
@pytest.mark.parametrize("through_parser", [True, False])
def test_read_replies_reads_in_order_and_raises_error_replies(
    client: redis.Redis, through_parser: bool
) -> None:
    def pack(*args: bytes) -> bytes:
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)

    conn = client.connection_pool.get_connection()
    try:
        source = conn if through_parser else _NoParser(conn)
        commands = [(b"SET", b"k", b"v"), (b"GET", b"k"), (b"GET", b"none"), (b"INCR", b"n")]
        conn.send_packed_command([pack(*c) for c in commands])
        assert read_replies(source, 4) == [b"OK", b"v", None, 1]  # type: ignore[arg-type]
        conn.send_packed_command([pack(b"INCR", b"k"), pack(b"PING")])
        with pytest.raises(redis.ResponseError, match="not an integer"):
            read_replies(source, 2)  # type: ignore[arg-type]
    finally:
        conn.disconnect()  # a reply may be left unread after the error
        client.connection_pool.release(conn)
