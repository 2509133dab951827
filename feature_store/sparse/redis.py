"""Sparse table in Redis: one binary key per row (weights then state), pipelined in chunks.

Layout (prefixes from :func:`feature_store.constants.sparse_prefix`, so every
key is namespaced by model family and table)::

    {root}:sp:{model}:{table}:r:<8 bytes key, big-endian>   weights | optimizer state
    {root}:sp:{model}:{table}:c:<8 bytes key, big-endian>   sightings of a key not yet admitted

A row's value is its ``dim`` weights followed by its ``state_width``
optimizer-state values, little-endian float32 (``4 * (dim + state_width)``
bytes). Keeping both in one value is what makes a row's weights and state
one unit for Redis: one ``SET`` writes both, one ``MGET`` entry reads both,
and one ``PX`` TTL, refreshed by every push, expires both together, so a row
not updated for ``ttl_s`` disappears with its state and Redis does the
expiring; counters carry the same TTL. Serving reads rows with the same
``MGET`` (``pull`` without ``train``) and drops the state bytes: for Adagrad
twice the bytes of weights alone, which for rows of a few dozen bytes costs
less than a second command per key would.

Commands, for each chunk of ``batch_chunk`` keys (never one per key), every
chunk's commands of a step sent before any reply is read:

- ``pull``: one ``MGET``. A training pull that finds missing keys adds, for
  those keys only, one round trip of ``INCR`` + ``PEXPIRE`` on their
  counters (skipped when ``admission_threshold`` is 1), and one round trip
  writing the admitted rows with ``SET ... NX PX`` so that a row another
  trainer just created is never reset to its initial value.
- ``push``: one ``MGET`` (the rows as they are now, not as the pull saw
  them, so another trainer's update in between is built on), the optimizer
  in numpy, then one ``SET ... PX`` per row, whose replies are read last.
  Keys whose rows are missing (not admitted, or expired) drop their
  gradient, as the contract says.

Both are also offered as steps (``pull_steps``, ``push_steps``; see
:mod:`.steps`), which the trainer runs for all its tables at once so that
Redis works on one table while this process decodes another.

Concurrency: last writer wins. Two trainers pushing the same key at once
both read the row, both compute an update, and the ``SET`` that runs second
overwrites the first; that one update to that key is lost (asynchronous SGD
tolerates it, and the alternative, ``WATCH`` and retry, would serialize every
hot key). A row's weights and state are one value written by one ``SET``,
so they always come from the same writer and the same update, never a mix
of two, and a push always starts from one update's weights and state. No
``MULTI``/``EXEC`` is needed for that: a chunk's ``SET``\\ s are pipelined
and each is atomic on its own. A push that fails part-way (a dropped
connection) may have written some of its rows; the trainer retries the
batch and those rows take its gradient twice, as the tables pushed before
the failure do.

Commands are packed by numpy rather than by redis-py: every key of a table
has the same length and every row the same byte size, so a chunk's ``MGET``
or ``SET`` commands are fixed-width records assembled in a few vectorized
copies and sent with the client's own connection (``send_packed_command``,
``read_response``). Packing 8,192 ``SET`` commands through redis-py's
pipeline costs more than the network and Redis together.

The client is the caller's: the table borrows connections from its pool and
closes it only if it was handed ``owns_client=True`` (see
:func:`feature_store.sparse.factory.connect_redis`). On Redis Cluster a
chunk's keys would span slots: :mod:`feature_store.sparse.cluster` keeps the
same commands per hash-tag bucket instead. Every redis-py error, including
connection refused and timeouts, surfaces as ``SparseTableUnavailable``; the
connection it happened on is dropped so no half-read reply is reused.

``stats`` counts rows with ``SCAN MATCH`` over the rows' prefix, which
walks the whole keyspace of the database (about a second per 10 million
keys) and holds 8 bytes per row to deduplicate: meant for a dashboard
refreshed every few seconds at most, not for a hot path. ``admissions``
counts rows this object created; ``expirations`` is 0 because Redis expires
keys itself.

Earlier versions kept weights (``:w:``) and state (``:s:``) under two keys
written in one ``MULTI``/``EXEC``; this layout uses another kind letter, so
the two never read each other's bytes. Rows under the old keys are not read
(re-seed from a snapshot taken before the upgrade, or let them expire).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import numpy as np
import redis
from redis.connection import AbstractConnection

from feature_store.constants import SPARSE_ROWS, SPARSE_SIGHTINGS, sparse_prefix
from feature_store.errors import ConfigurationError, InvalidInput, SparseTableUnavailable
from feature_store.settings import SparseSettings
from feature_store.sparse.base import Keys, Rows, TableSpec, TableStats
from feature_store.sparse.initializers import Initializer
from feature_store.sparse.optimizers import as_grads, as_keys, make_optimizer
from feature_store.sparse.snapshot import SnapshotData, read_snapshot, write_snapshot
from feature_store.sparse.steps import Steps, run

_CRLF = b"\r\n"



def _records(n: int, parts: Sequence[bytes | np.ndarray]) -> bytes:
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


def _key_bytes(keys: Keys) -> np.ndarray:
    """``(n, 8)`` uint8: each key big-endian (so a prefix scan lists keys in order)."""
    return keys.astype(">u8").view(np.uint8).reshape(len(keys), 8)


def _row_bytes(rows: Rows) -> np.ndarray:
    """``(n, 4 * width)`` uint8 view of little-endian float32 rows."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    return rows.view(np.uint8).reshape(len(rows), -1)


def _value_bytes(weights: Rows, state: Rows) -> np.ndarray:
    """``(n, 4 * (dim + state_width))`` uint8: each row's stored value, weights then state."""
    return _row_bytes(np.concatenate((weights, state), axis=1))


def _glob_escape(prefix: bytes) -> bytes:
    for char in (b"\\", b"*", b"?", b"[", b"]"):
        prefix = prefix.replace(char, b"\\" + char)
    return prefix


class _Kind:
    """Command builders for the keys of one prefix (rows or counters)."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.key_len = len(prefix) + 8
        self._key_head = b"$%d\r\n" % self.key_len + prefix
        self.pattern = _glob_escape(prefix) + b"*"

    def mget(self, kb: np.ndarray) -> bytes:
        """One ``MGET`` of ``kb``'s keys."""
        return b"*%d\r\n$4\r\nMGET\r\n" % (len(kb) + 1) + _records(
            len(kb), (self._key_head, kb, _CRLF)
        )

    def set(self, kb: np.ndarray, values: np.ndarray, ttl_ms: int, nx: bool = False) -> bytes:
        """``SET key value PX ttl [NX]`` for each row of ``kb``/``values``."""
        head = b"*6\r\n$3\r\nSET\r\n" if nx else b"*5\r\n$3\r\nSET\r\n"
        ttl = b"%d" % ttl_ms
        tail = b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
        if nx:
            tail += b"$2\r\nNX\r\n"
        value_head = b"\r\n$%d\r\n" % values.shape[1]
        return _records(len(kb), (head + self._key_head, kb, value_head, values, tail))

    def incr_pexpire(self, kb: np.ndarray, ttl_ms: int) -> bytes:
        ttl = b"%d" % ttl_ms
        incr_tail = b"\r\n"
        expire_head = b"*3\r\n$7\r\nPEXPIRE\r\n" + self._key_head
        expire_tail = b"\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
        return _records(
            len(kb),
            (b"*2\r\n$4\r\nINCR\r\n" + self._key_head, kb, incr_tail, expire_head, kb, expire_tail),
        )

    def simple(self, command: bytes, kb: np.ndarray) -> bytes:
        """``COMMAND key`` for each key (PTTL, DEL...)."""
        head = b"*2\r\n$%d\r\n%s\r\n" % (len(command), command) + self._key_head
        return _records(len(kb), (head, kb, _CRLF))


class RedisSparseTable:
    """A :class:`~feature_store.sparse.base.SparseTable` stored in Redis (see module doc)."""

    def __init__(
        self,
        spec: TableSpec,
        settings: SparseSettings,
        client: redis.Redis,
        *,
        chunk: int = 8192,
        owns_client: bool = False,
    ) -> None:
        if not isinstance(client, redis.Redis):
            raise ConfigurationError(
                f"RedisSparseTable needs a redis.Redis client, got {type(client).__name__} "
                "(for Redis Cluster, ClusterSparseTable)"
            )
        if client.get_connection_kwargs().get("decode_responses"):
            raise ConfigurationError("the sparse tables need a client with decode_responses=False")
        if chunk < 1:
            raise ConfigurationError(f"chunk must be at least 1, got {chunk}")
        self.spec = spec
        self.model = settings.model_name
        self.optimizer = make_optimizer(spec.optimizer, settings)
        self.state_width = self.optimizer.state_width(spec.dim)
        self._initializer = Initializer(
            spec.name, spec.dim, settings.init_scale, self.optimizer.zero_init
        )
        self._threshold = settings.admission_threshold
        self._ttl_s = settings.ttl_s
        self._ttl_ms = max(1, round(settings.ttl_s * 1000))
        self._client = client
        self._owns_client = owns_client
        self._chunk = chunk
        self._r = _Kind(sparse_prefix(self.model, spec.name, SPARSE_ROWS))
        self._c = _Kind(sparse_prefix(self.model, spec.name, SPARSE_SIGHTINGS))
        self._value_bytes = 4 * (spec.dim + self.state_width)
        self._admissions = 0
        self._counter_lock = threading.Lock()  # one table object may serve several threads

    # --- plumbing -----------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[AbstractConnection]:
        """A pooled connection; redis-py errors become ``SparseTableUnavailable``."""
        pool = self._client.connection_pool
        try:
            conn = pool.get_connection()
        except (redis.RedisError, OSError) as exc:
            raise SparseTableUnavailable(
                f"sparse table {self.spec.name!r}: Redis unreachable: {exc}"
            ) from exc
        try:
            yield conn
        except (redis.RedisError, OSError) as exc:
            conn.disconnect()
            raise SparseTableUnavailable(f"sparse table {self.spec.name!r}: {exc}") from exc
        except BaseException:
            conn.disconnect()  # its reply stream may be out of step with its commands
            raise
        finally:
            pool.release(conn)

    @staticmethod
    def _replies(conn: AbstractConnection, count: int) -> list[object]:
        """The next ``count`` replies; an error reply raises (and the connection is dropped)."""
        return read_replies(conn, count)

    def _weights_into(self, reply: object, out: Rows) -> np.ndarray:
        """Write the weights of an ``MGET`` of rows into ``out`` (zeros where missing),
        copying each once and the state never; the present mask."""
        values: list[object] = reply  # type: ignore[assignment]
        present = np.fromiter(map(bool, values), dtype=bool, count=len(values))
        joined = b"".join(filter(None, values))  # type: ignore[arg-type]
        count = int(present.sum())
        if len(joined) != count * self._value_bytes:
            raise SparseTableUnavailable(
                f"sparse table {self.spec.name!r}: a value under {self._r.prefix!r} is not "
                f"{self._value_bytes} bytes (another writer with another dim or optimizer?)"
            )
        rows = np.frombuffer(joined, dtype="<f4").reshape(count, self._value_bytes // 4)
        found = rows[:, : self.spec.dim]
        if count == len(values):
            out[:] = found
        else:
            out[:] = 0.0
            out[present] = found
        return present

    def _split(self, reply: object) -> tuple[Rows, Rows, np.ndarray]:
        """Weights ``(n, dim)``, state ``(n, state_width)`` (zeros where missing) and the
        present mask, from the reply to an ``MGET`` of rows."""
        return split_rows(
            reply,  # type: ignore[arg-type]
            self.spec.dim,
            self.state_width,
            f"sparse table {self.spec.name!r}",
            self._r,
        )

    def _chunks(self, n: int) -> Iterator[slice]:
        for start in range(0, n, self._chunk):
            yield slice(start, min(n, start + self._chunk))

    # --- SparseTable --------------------------------------------------

    def pull(self, keys: Keys, *, train: bool = False) -> Rows:
        return run([self.pull_steps(keys, train=train)])[0]  # type: ignore[return-value]

    def push(self, keys: Keys, grads: Rows) -> None:
        run([self.push_steps(keys, grads)])

    def pull_steps(self, keys: Keys, *, train: bool = False) -> Steps[Rows]:
        """:meth:`pull` as steps (:mod:`.steps`): each yield waits on Redis."""
        keys = as_keys(keys)
        out = np.empty((len(keys), self.spec.dim), dtype=np.float32)
        with self._connection() as conn:
            parts = list(self._chunks(len(keys)))
            kb = _key_bytes(keys)
            conn.send_packed_command([self._r.mget(kb[part]) for part in parts])
            yield
            missing = []
            for part in parts:
                present = self._weights_into(conn.read_response(disable_decoding=True), out[part])
                if train and not present.all():
                    missing.append(part.start + np.flatnonzero(~present))
            if missing:
                at = np.concatenate(missing)
                out[at] = yield from self._sight_steps(conn, keys[at], kb[at])
        return out

    def _sight_steps(self, conn: AbstractConnection, keys: Keys, kb: np.ndarray) -> Steps[Rows]:
        """Count sightings of missing keys, admit those at the threshold; their rows."""
        rows = np.zeros((len(keys), self.spec.dim), dtype=np.float32)
        parts = list(self._chunks(len(keys)))
        if self._threshold > 1:
            conn.send_packed_command(
                [self._c.incr_pexpire(kb[part], self._ttl_ms) for part in parts]
            )
            yield
            counts = self._replies(conn, 2 * len(keys))[0::2]
            admit = np.fromiter(counts, dtype=np.int64, count=len(keys)) >= self._threshold
        else:
            admit = np.ones(len(keys), dtype=bool)
        if not admit.any():
            return rows
        new_keys, new_kb = keys[admit], kb[admit]
        weights = self._initializer(new_keys)
        values = _value_bytes(weights, self.optimizer.initial_state(len(new_keys), self.spec.dim))
        parts = list(self._chunks(len(new_keys)))
        for part in parts:
            body = [self._r.set(new_kb[part], values[part], self._ttl_ms, nx=True)]
            if self._threshold > 1:
                body.append(self._c.simple(b"DEL", new_kb[part]))
            conn.send_packed_command(body)
        yield
        created = np.empty(len(new_keys), dtype=bool)
        for part in parts:
            replies = self._replies(conn, part.stop - part.start)
            created[part] = [r is not None for r in replies]
            if self._threshold > 1:
                self._replies(conn, part.stop - part.start)  # DEL's counts
        with self._counter_lock:
            self._admissions += int(created.sum())
        if not created.all():
            # Another trainer created these rows a moment ago: return what it stored.
            lost = np.flatnonzero(~created)
            conn.send_packed_command([self._r.mget(new_kb[lost])])
            yield
            theirs, _, there = self._split(conn.read_response(disable_decoding=True))
            weights[lost[there]] = theirs[there]
        rows[admit] = weights
        return rows

    def push_steps(self, keys: Keys, grads: Rows) -> Steps[None]:
        """:meth:`push` as steps (:mod:`.steps`): each yield waits on Redis."""
        keys = as_keys(keys)
        grads = as_grads(grads, len(keys), self.spec.dim)
        with self._connection() as conn:
            parts = list(self._chunks(len(keys)))
            kb = _key_bytes(keys)
            conn.send_packed_command([self._r.mget(kb[part]) for part in parts])
            yield
            written = 0
            for part in parts:
                weights, state, present = self._split(conn.read_response(disable_decoding=True))
                chunk_kb, chunk_grads = kb[part], grads[part]
                if not present.all():  # not admitted or expired: the gradient is dropped
                    chunk_kb, chunk_grads = chunk_kb[present], chunk_grads[present]
                    weights, state = weights[present], state[present]
                if not len(chunk_kb):
                    continue
                weights, state = self.optimizer.apply(weights, state, chunk_grads)
                conn.send_packed_command(
                    [self._r.set(chunk_kb, _value_bytes(weights, state), self._ttl_ms)]
                )
                written += len(chunk_kb)
            if written:
                yield
                self._replies(conn, written)

    def expire(self, now_s: float | None = None) -> int:
        """Nothing to do: Redis expires rows itself (``PX`` on every write)."""
        return 0

    def _scan(self, kind: _Kind) -> Iterator[list[bytes]]:
        """Batches of the names of ``kind``'s keys (SCAN; a key may come twice)."""
        cursor = 0
        while True:
            cursor, names = self._client.scan(cursor, match=kind.pattern, count=self._chunk)
            if names:
                yield [name for name in names if isinstance(name, bytes)]  # binary client
            if cursor == 0:
                return

    def stats(self) -> TableStats:
        """Row count by SCAN (see the module doc for its cost); 8 bytes of memory per row."""
        try:
            parts = [
                np.frombuffer(b"".join(n[-8:] for n in batch if len(n) == self._r.key_len), ">u8")
                for batch in self._scan(self._r)
            ]
        except (redis.RedisError, OSError) as exc:
            raise SparseTableUnavailable(f"sparse table {self.spec.name!r}: {exc}") from exc
        # SCAN may return a key twice (when Redis resizes its hash table mid-scan): dedupe.
        rows = len(np.unique(np.concatenate(parts))) if parts else 0
        return TableStats(
            rows=rows,
            admissions=self._admissions,
            expirations=0,
            bytes=rows * self._value_bytes,
        )

    def export(self) -> SnapshotData:
        """Every row with its state and update time (from its remaining TTL), via SCAN."""
        key_parts, weight_parts, state_parts, updated_parts = [], [], [], []
        seen: set[bytes] = set()
        try:
            with self._connection() as conn:
                for names in self._scan(self._r):
                    fresh = [n for n in names if len(n) == self._r.key_len and n not in seen]
                    seen.update(fresh)
                    if not fresh:
                        continue
                    keys = np.frombuffer(b"".join(n[-8:] for n in fresh), dtype=">u8")
                    kb = _key_bytes(keys.astype(np.uint64))
                    conn.send_packed_command([self._r.mget(kb), self._r.simple(b"PTTL", kb)])
                    weights, state, ok = split_rows(
                        conn.read_response(disable_decoding=True),
                        self.spec.dim,
                        self.state_width,
                        f"sparse table {self.spec.name!r}",
                        self._r,
                    )
                    pttl = np.array(self._replies(conn, len(fresh)), dtype=np.float64)
                    now = time.time()
                    ok &= pttl != -2
                    remaining_s = np.where(pttl >= 0, pttl / 1000.0, self._ttl_s)
                    key_parts.append(keys.astype(np.uint64)[ok])
                    weight_parts.append(weights[ok])
                    state_parts.append(state[ok])
                    updated_parts.append((now - (self._ttl_s - remaining_s))[ok])
        except (redis.RedisError, OSError) as exc:
            raise SparseTableUnavailable(f"sparse table {self.spec.name!r}: {exc}") from exc
        if not key_parts:
            return SnapshotData.empty(self.spec, self.state_width)
        keys = np.concatenate(key_parts)
        order = np.argsort(keys)
        return SnapshotData(
            self.spec,
            keys[order],
            np.concatenate(weight_parts)[order],
            np.concatenate(state_parts)[order],
            np.concatenate(updated_parts)[order],
        )

    def snapshot(self, directory: Path) -> None:
        write_snapshot(directory, self.export())

    def restore(self, directory: Path) -> int:
        return self.load(read_snapshot(directory, self.spec, self.state_width))

    def load(self, data: SnapshotData) -> int:
        """Replace the table's rows with ``data``; each row keeps its remaining TTL."""
        if data.state.shape[1] != self.state_width:
            raise InvalidInput(
                "snapshot.state", f"width {data.state.shape[1]}, want {self.state_width}"
            )
        self.clear()
        data = data.live(time.time(), self._ttl_s)
        remaining_ms = np.maximum(
            1, np.round((data.updated_at + self._ttl_s - time.time()) * 1000)
        ).astype(np.int64)
        try:
            for part in self._chunks(len(data.keys)):
                pipe = self._client.pipeline(transaction=False)
                names = [self._r.prefix + k for k in _split8(_key_bytes(data.keys[part]))]
                values = _value_bytes(data.weights[part], data.state[part])
                for name, value, ttl in zip(
                    names, values, remaining_ms[part].tolist(), strict=True
                ):
                    pipe.set(name, value.tobytes(), px=ttl)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            raise SparseTableUnavailable(f"sparse table {self.spec.name!r}: {exc}") from exc
        return len(data.keys)

    def clear(self) -> None:
        try:
            for kind in (self._r, self._c):
                for names in self._scan(kind):
                    self._client.unlink(*names)
        except (redis.RedisError, OSError) as exc:
            raise SparseTableUnavailable(f"sparse table {self.spec.name!r}: {exc}") from exc

    def close(self) -> None:
        """Close the client if this table owns it; a borrowed client stays open."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RedisSparseTable:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisSparseTable({self.model!r}/{self.spec.name!r}, dim={self.spec.dim})"


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


def _split8(kb: np.ndarray) -> list[bytes]:
    raw = kb.tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def decode_rows(
    values: list[object], width_bytes: int, what: str, kind: _Kind
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
    values: list[object], dim: int, state_width: int, what: str, kind: _Kind
) -> tuple[Rows, Rows, np.ndarray]:
    """Weights ``(n, dim)`` and state ``(n, state_width)`` from an MGET reply of rows.

    Zeros where a row is missing; the third array says which are present.
    Both are contiguous copies, so the optimizer and the caller may keep them.
    """
    rows, present = decode_rows(values, 4 * (dim + state_width), what, kind)
    return np.ascontiguousarray(rows[:, :dim]), np.ascontiguousarray(rows[:, dim:]), present
