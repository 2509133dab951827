"""RESP, the Redis wire protocol, for the sparse tables: the one module touching redis-py internals.

The Redis sparse tables (:mod:`.redis`, :mod:`.cluster`) pack their commands
with numpy rather than through redis-py: every key of a table has the same
length and every row the same byte size, so a chunk's ``MGET`` or ``SET``
commands are fixed-width records assembled in a few vectorized copies
(:class:`Kind`) and written with a pooled connection's
``send_packed_command``. Packing 8,192 ``SET`` commands through redis-py's
pipeline costs more than the network and Redis together.

Everything here that reaches past redis-py's documented surface, and so may
break on a redis-py upgrade, is in this module and pinned by
``tests/feature_store/test_resp.py`` to :data:`REDIS_PY_TESTED`:

- :func:`read_replies` reads through the connection's private ``_parser``;
- :func:`borrowed` takes connections from a client's pool by hand (and
  :func:`command_steps`, the stores' reads issued together with others);
- :func:`node_for_slot` and :func:`refresh_slots` use a
  :class:`~redis.cluster.RedisCluster`'s ``nodes_manager``.

Errors: :func:`borrowed` turns every Redis failure
(:data:`~feature_store.redis_errors.REDIS_FAILURES`) into the error type it
is given and drops the connection, so no half-read reply is ever reused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection

from feature_store.errors import BackendUnavailable, SparseTableUnavailable
from feature_store.redis_errors import REDIS_FAILURES
from feature_store.sparse.base import Keys, Rows
from feature_store.sparse.steps import Steps

REDIS_PY_TESTED = "8.2"
"""The redis-py ``major.minor`` whose internals this module was checked against."""

CRLF = b"\r\n"
MULTI = b"*1\r\n$5\r\nMULTI\r\n"
EXEC = b"*1\r\n$4\r\nEXEC\r\n"


def pack(*args: bytes) -> bytes:
    """One command, packed (for the odd command that is not a fixed-width record)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def records(n: int, parts: Sequence[bytes | np.ndarray]) -> bytes:
    """``n`` fixed-width records, each the concatenation of ``parts``.

    A ``bytes`` part is the same in every record; an array part is ``(n,
    width)`` uint8, one row per record.
    """
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in parts]
    out = np.empty((n, sum(widths)), dtype=np.uint8)
    col = 0
    for part, width in zip(parts, widths, strict=True):
        out[:, col : col + width] = (
            np.frombuffer(part, np.uint8) if isinstance(part, bytes) else part
        )
        col += width
    return out.tobytes()


def key_bytes(keys: Keys) -> np.ndarray:
    """``(n, 8)`` uint8: each key big-endian (so a prefix scan lists keys in order)."""
    return keys.astype(">u8").view(np.uint8).reshape(len(keys), 8)


def row_bytes(rows: Rows) -> np.ndarray:
    """``(n, 4 * width)`` uint8 view of little-endian float32 rows."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    return rows.view(np.uint8).reshape(len(rows), -1)


def value_bytes(weights: Rows, state: Rows) -> np.ndarray:
    """``(n, 4 * (dim + state_width))`` uint8: each row's stored value, weights then state."""
    return row_bytes(np.concatenate((weights, state), axis=1))


def glob_escape(prefix: bytes) -> bytes:
    for char in (b"\\", b"*", b"?", b"[", b"]"):
        prefix = prefix.replace(char, b"\\" + char)
    return prefix


class Kind:
    """Command builders for the keys of one prefix (rows or counters)."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.key_len = len(prefix) + 8
        self._key_head = b"$%d\r\n" % self.key_len + prefix
        self.pattern = glob_escape(prefix) + b"*"

    def mget(self, kb: np.ndarray) -> bytes:
        """One ``MGET`` of ``kb``'s keys."""
        return b"*%d\r\n$4\r\nMGET\r\n" % (len(kb) + 1) + records(
            len(kb), (self._key_head, kb, CRLF)
        )

    def set(self, kb: np.ndarray, values: np.ndarray, ttl_ms: int, nx: bool = False) -> bytes:
        """``SET key value PX ttl [NX]`` for each row of ``kb``/``values``."""
        head = b"*6\r\n$3\r\nSET\r\n" if nx else b"*5\r\n$3\r\nSET\r\n"
        ttl = b"%d" % ttl_ms
        tail = b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
        if nx:
            tail += b"$2\r\nNX\r\n"
        value_head = b"\r\n$%d\r\n" % values.shape[1]
        return records(len(kb), (head + self._key_head, kb, value_head, values, tail))

    def incr_pexpire(self, kb: np.ndarray, ttl_ms: int) -> bytes:
        ttl = b"%d" % ttl_ms
        incr_tail = b"\r\n"
        expire_head = b"*3\r\n$7\r\nPEXPIRE\r\n" + self._key_head
        expire_tail = b"\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
        return records(
            len(kb),
            (b"*2\r\n$4\r\nINCR\r\n" + self._key_head, kb, incr_tail, expire_head, kb, expire_tail),
        )

    def simple(self, command: bytes, kb: np.ndarray) -> bytes:
        """``COMMAND key`` for each key (PTTL, DEL...)."""
        head = b"*2\r\n$%d\r\n%s\r\n" % (len(command), command) + self._key_head
        return records(len(kb), (head, kb, CRLF))




@contextmanager
def borrowed(
    pool: redis.ConnectionPool, error: type[BackendUnavailable], what: str
) -> Iterator[AbstractConnection]:
    """A connection from ``pool`` for the block; Redis failures raise ``error``.

    On any failure the connection is dropped before it goes back to the
    pool: its reply stream may be out of step with the commands sent.
    """
    try:
        conn = pool.get_connection()
    except REDIS_FAILURES as exc:
        raise error(f"{what}: Redis unreachable: {exc}") from exc
    try:
        yield conn
    except REDIS_FAILURES as exc:
        conn.disconnect()
        raise error(f"{what}: {exc}") from exc
    except BaseException:
        conn.disconnect()  # its reply stream may be out of step with its commands
        raise
    finally:
        pool.release(conn)


def command_steps(
    client: redis.Redis,
    commands: Sequence[tuple[Any, ...]],
    error: type[BackendUnavailable],
    what: str,
) -> Steps[list[Any]]:
    """``commands`` on one pooled connection of ``client``, as steps (:mod:`.steps`):
    written at once, then, after the ``yield``, their replies read undecoded (an error
    reply raises). Redis failures raise ``error("{what}: {cause}")``.

    What lets a store's reads ride in the same round trip as other stores' reads: run
    together (:func:`~feature_store.sparse.steps.run`), each holds its own connection and
    every one's commands reach Redis before any reply is awaited, so the request waits
    for Redis, and then for a core, once instead of once per store.
    """
    with borrowed(client.connection_pool, error, what) as conn:
        conn.send_packed_command(conn.pack_commands(commands))
        yield
        return read_replies(conn, len(commands))


def score_pairs(reply: Sequence[Any]) -> list[tuple[Any, float]]:
    """A ``WITHSCORES`` reply read undecoded as (member, score) pairs, each score a float:
    RESP3 nests each pair (its score a double already), RESP2 alternates them (the score
    as text)."""
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return list(zip(reply[0::2], map(float, reply[1::2]), strict=True))


def read_reply(conn: AbstractConnection) -> Any:
    """The next reply on ``conn``, undecoded (an error reply raises); its shape is the
    command's (bytes, int, None, a list of those)."""
    return conn.read_response(disable_decoding=True)


def node_for_slot(client: RedisCluster, slot: int) -> ClusterNode | None:
    """The primary serving ``slot`` in ``client``'s current slot map (None if unknown)."""
    node = client.nodes_manager.get_node_from_slot(slot)
    if node is None or node.redis_connection is None:
        return None
    return node


def node_pool(node: ClusterNode) -> redis.ConnectionPool:
    """The connection pool of a node found by :func:`node_for_slot`."""
    return node.redis_connection.connection_pool  # type: ignore[union-attr]


def refresh_slots(client: RedisCluster) -> None:
    """Rebuild ``client``'s slot map from the cluster (after ``MOVED``/``ASK``)."""
    client.nodes_manager.initialize()


def read_replies(conn: AbstractConnection, count: int) -> list[object]:
    """The next ``count`` replies on ``conn``, undecoded; the first error reply is raised.

    A push reads one ``+OK`` per row (about 4,000 a batch), and the
    connection's ``read_response`` spends most of its ~0.8 µs a reply in
    bookkeeping (formatting the host name for error messages, health-check
    timestamps) around its parser's. This asks the parser directly
    (``conn._parser``, redis-py's for as long as it has had pluggable
    parsers), which returns an error reply as an exception object and raises
    redis-py's timeout and connection errors itself: 4,000 ``SET`` replies
    took 3.2-3.6 ms of this thread's CPU through ``read_response``, 1.5-1.9 ms
    here (hiredis parser, local redis-server). A connection without that
    attribute is read through ``read_response``.
    """
    read = getattr(getattr(conn, "_parser", None), "read_response", None)
    if read is None:
        return [conn.read_response(disable_decoding=True) for _ in range(count)]
    replies = [read(disable_decoding=True) for _ in range(count)]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def split8(kb: np.ndarray) -> list[bytes]:
    raw = kb.tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def decode_rows(
    values: list[object], width_bytes: int, what: str, kind: Kind
) -> tuple[Rows, np.ndarray]:
    """Rows ``(n, width)`` from an MGET reply (zeros where missing) and the present mask.

    A value of the wrong length (another writer with another dim or
    optimizer) raises ``SparseTableUnavailable`` rather than being misread.
    """
    n = len(values)
    width = width_bytes // 4
    present = np.fromiter(map(bool, values), dtype=bool, count=n)
    joined = b"".join(filter(None, values))  # type: ignore[arg-type]
    count = int(present.sum())
    if len(joined) != count * width_bytes:
        raise SparseTableUnavailable(
            f"{what}: a value under {kind.prefix!r} is not "
            f"{width_bytes} bytes (another writer with another dim or optimizer?)"
        )
    found = np.frombuffer(joined, dtype="<f4").reshape(count, width)
    if count == n:
        return found.astype(np.float32), present
    rows = np.zeros((n, width), dtype=np.float32)
    rows[present] = found
    return rows, present


def split_rows(
    values: list[object], dim: int, state_width: int, what: str, kind: Kind
) -> tuple[Rows, Rows, np.ndarray]:
    """Weights ``(n, dim)`` and state ``(n, state_width)`` from an MGET reply of rows.

    Zeros where a row is missing; the third array says which are present.
    Both are contiguous copies, so the optimizer and the caller may keep them.
    """
    rows, present = decode_rows(values, 4 * (dim + state_width), what, kind)
    return np.ascontiguousarray(rows[:, :dim]), np.ascontiguousarray(rows[:, dim:]), present
