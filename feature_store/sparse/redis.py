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

Commands are packed by numpy rather than by redis-py, and replies read
straight from the connection's parser: :mod:`.resp` does both (it is the
one module touching redis-py's internals).

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
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

import numpy as np
import redis
from redis.connection import AbstractConnection

from feature_store.constants import SPARSE_ROWS, SPARSE_SIGHTINGS, sparse_prefix
from feature_store.errors import ConfigurationError, InvalidInput, SparseTableUnavailable
from feature_store.redis_errors import redis_errors
from feature_store.settings import SparseSettings
from feature_store.sparse.base import Keys, Rows, TableSpec, TableStats
from feature_store.sparse.initializers import Initializer
from feature_store.sparse.optimizers import as_grads, as_keys, make_optimizer
from feature_store.sparse.resp import (
    Kind,
    borrowed,
    key_bytes,
    read_replies,
    read_reply,
    split8,
    split_rows,
    value_bytes,
)
from feature_store.sparse.snapshot import SnapshotData, read_snapshot, write_snapshot
from feature_store.sparse.steps import Steps, run


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
            spec.name, spec.dim, settings.init_scale, self.optimizer.zero_init, spec.preset
        )
        self._threshold = settings.admission_threshold
        self._ttl_s = settings.ttl_s
        self._ttl_ms = max(1, round(settings.ttl_s * 1000))
        self._client = client
        self._owns_client = owns_client
        self._chunk = chunk
        self._r = Kind(sparse_prefix(self.model, spec.name, SPARSE_ROWS))
        self._c = Kind(sparse_prefix(self.model, spec.name, SPARSE_SIGHTINGS))
        self._value_bytes = 4 * (spec.dim + self.state_width)
        self._admissions = 0
        self._counter_lock = threading.Lock()  # one table object may serve several threads
        self._what = f"sparse table {spec.name!r}"

    # --- plumbing -----------------------------------------------------

    def _connection(self) -> AbstractContextManager[AbstractConnection]:
        """A pooled connection; Redis failures become ``SparseTableUnavailable``."""
        return borrowed(self._client.connection_pool, SparseTableUnavailable, self._what)

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
            kb = key_bytes(keys)
            conn.send_packed_command([self._r.mget(kb[part]) for part in parts])
            yield
            missing = []
            for part in parts:
                present = self._weights_into(read_reply(conn), out[part])
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
        values = value_bytes(weights, self.optimizer.initial_state(len(new_keys), self.spec.dim))
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
            theirs, _, there = self._split(read_reply(conn))
            weights[lost[there]] = theirs[there]
        rows[admit] = weights
        return rows

    def push_steps(self, keys: Keys, grads: Rows) -> Steps[None]:
        """:meth:`push` as steps (:mod:`.steps`): each yield waits on Redis."""
        keys = as_keys(keys)
        grads = as_grads(grads, len(keys), self.spec.dim)
        with self._connection() as conn:
            parts = list(self._chunks(len(keys)))
            kb = key_bytes(keys)
            conn.send_packed_command([self._r.mget(kb[part]) for part in parts])
            yield
            written = 0
            for part in parts:
                weights, state, present = self._split(read_reply(conn))
                chunk_kb, chunk_grads = kb[part], grads[part]
                if not present.all():  # not admitted or expired: the gradient is dropped
                    chunk_kb, chunk_grads = chunk_kb[present], chunk_grads[present]
                    weights, state = weights[present], state[present]
                if not len(chunk_kb):
                    continue
                weights, state = self.optimizer.apply(weights, state, chunk_grads)
                conn.send_packed_command(
                    [self._r.set(chunk_kb, value_bytes(weights, state), self._ttl_ms)]
                )
                written += len(chunk_kb)
            if written:
                yield
                self._replies(conn, written)

    def expire(self, now_s: float | None = None) -> int:
        """Nothing to do: Redis expires rows itself (``PX`` on every write)."""
        return 0

    def _scan(self, kind: Kind) -> Iterator[list[bytes]]:
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
        with redis_errors(SparseTableUnavailable, self._what):
            parts = [
                np.frombuffer(b"".join(n[-8:] for n in batch if len(n) == self._r.key_len), ">u8")
                for batch in self._scan(self._r)
            ]
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
        with redis_errors(SparseTableUnavailable, self._what):
            with self._connection() as conn:
                for names in self._scan(self._r):
                    fresh = [n for n in names if len(n) == self._r.key_len and n not in seen]
                    seen.update(fresh)
                    if not fresh:
                        continue
                    keys = np.frombuffer(b"".join(n[-8:] for n in fresh), dtype=">u8")
                    kb = key_bytes(keys.astype(np.uint64))
                    conn.send_packed_command([self._r.mget(kb), self._r.simple(b"PTTL", kb)])
                    weights, state, ok = split_rows(
                        read_reply(conn),
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
        with redis_errors(SparseTableUnavailable, self._what):
            for part in self._chunks(len(data.keys)):
                pipe = self._client.pipeline(transaction=False)
                names = [self._r.prefix + k for k in split8(key_bytes(data.keys[part]))]
                values = value_bytes(data.weights[part], data.state[part])
                for name, value, ttl in zip(
                    names, values, remaining_ms[part].tolist(), strict=True
                ):
                    pipe.set(name, value.tobytes(), px=ttl)
                pipe.execute()
        return len(data.keys)

    def clear(self) -> None:
        with redis_errors(SparseTableUnavailable, self._what):
            for kind in (self._r, self._c):
                for names in self._scan(kind):
                    self._client.unlink(*names)

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
