"""Sparse table on Redis Cluster: rows in hash-tag buckets, round trips grouped by node.

On a Redis Cluster every key lives in one of 16,384 hash slots, and a
multi-key command (``MGET``) or a ``MULTI``/``EXEC`` is refused unless all its
keys share one slot. The single-node layout of :mod:`.redis` spreads a
batch's keys over every slot, so this backend tags them instead
(:func:`feature_store.constants.sparse_cluster_prefix`)::

    {root}:sp:{model:table:bucket}:r:<8 bytes key>    weights | optimizer state
    {root}:sp:{model:table:bucket}:c:<8 bytes key>    sightings

with ``bucket = key mod SPARSE_CLUSTER_BUCKETS`` (64). The part in braces is
the hash tag: a bucket's rows and counters share one slot. A row's value is
laid out as on a single Redis (:mod:`.redis`: weights then state, one key),
so its weights and state are read and written together, never torn. Each
bucket gets the commands a single Redis gets for a chunk (one ``MGET``, the
``SET``\\ s), its writes inside one ``MULTI``/``EXEC`` so that a bucket refused
mid-reshard is refused whole and can be resent as it is.
Each table spreads over 64 slots, which the cluster places on its nodes;
13 tables make about 830 slots, enough for an even spread over a few dozen
primaries (beyond that, raise the constant and re-seed the tables from a
snapshot: it is part of the layout).

Round trips: each step of a pull or push (read; for new keys, count
sightings and admit) sends every bucket's commands for one node in one
write to that node, to all nodes before reading any reply, so a step costs
one round trip per node, taken in parallel, whatever the batch size.
A batch of ``n`` keys is about ``min(n, 64)`` commands per step instead of
one per chunk: more commands for Redis to parse, the same bytes.

Resharding: a bucket refused with ``MOVED``/``ASK``/``TRYAGAIN``/``CLUSTERDOWN``
(its slot moved, or is moving) was not applied (a refused transaction is
aborted whole), so the table refreshes its slot map and resends only the
refused buckets, up to three times with a short pause; after that the
batch fails with ``SparseTableUnavailable`` and the trainer retries it.
Buckets already written are not written again, so a retry never applies a
gradient twice. A node that fails outright (connection refused, timeout)
fails the whole push after the other nodes may have applied their buckets;
the trainer retries the batch and those buckets take its gradient twice, as
the tables pushed before a failure do on a single Redis.

``stats``, ``export`` and ``clear`` ``SCAN`` each primary; ``load`` writes
with plain ``SET``\\ s grouped per node. Replicas are never read.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import numpy as np
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection
from redis.crc import key_slot

from feature_store.constants import (
    REDIS_ROOT,
    SPARSE_CLUSTER_BUCKETS,
    SPARSE_ROWS,
    SPARSE_SIGHTINGS,
    sparse_cluster_prefix,
)
from feature_store.errors import ConfigurationError, InvalidInput, SparseTableUnavailable
from feature_store.redis_errors import REDIS_FAILURES, redis_errors
from feature_store.settings import SparseSettings
from feature_store.sparse.base import Keys, Rows, TableSpec, TableStats
from feature_store.sparse.initializers import Initializer
from feature_store.sparse.optimizers import as_grads, as_keys, make_optimizer
from feature_store.sparse.resp import (
    EXEC,
    MULTI,
    Kind,
    glob_escape,
    key_bytes,
    node_for_slot,
    node_pool,
    pack,
    read_reply,
    refresh_slots,
    split_rows,
    value_bytes,
)
from feature_store.sparse.snapshot import SnapshotData, read_snapshot, write_snapshot

_REDIRECTS = (
    redis.exceptions.AskError,  # MovedError is a subclass
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)
_ATTEMPTS = 3
_PAUSE_S = (0.05, 0.2)


class _Group(NamedTuple):
    """One bucket's share of a batch: positions in the batch, at most ``chunk`` of them."""

    bucket: int
    at: np.ndarray


class _Refused(Exception):
    """A group's commands were refused by a redirect; none of them took effect."""


class ClusterSparseTable:
    """A :class:`~feature_store.sparse.base.SparseTable` on Redis Cluster (see module doc)."""

    def __init__(
        self,
        spec: TableSpec,
        settings: SparseSettings,
        client: RedisCluster,
        *,
        chunk: int = 8192,
        owns_client: bool = False,
    ) -> None:
        if not isinstance(client, RedisCluster):
            raise ConfigurationError(
                f"ClusterSparseTable needs a redis.cluster.RedisCluster, got "
                f"{type(client).__name__}"
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
        buckets = range(SPARSE_CLUSTER_BUCKETS)

        def kinds(kind: str) -> list[Kind]:
            return [Kind(sparse_cluster_prefix(self.model, spec.name, b, kind)) for b in buckets]

        self._r, self._c = kinds(SPARSE_ROWS), kinds(SPARSE_SIGHTINGS)
        self._slots = [key_slot(kind.prefix) for kind in self._r]  # the tag is in the prefix
        self._what = f"sparse table {spec.name!r}"
        self._value_bytes = 4 * (spec.dim + self.state_width)
        self._admissions = 0
        self._counter_lock = threading.Lock()

    # --- plumbing -----------------------------------------------------

    def _groups(self, keys: Keys) -> list[_Group]:
        """``keys`` split by bucket (then into pieces of at most ``chunk``)."""
        buckets = (keys % np.uint64(SPARSE_CLUSTER_BUCKETS)).astype(np.intp)
        order = np.argsort(buckets, kind="stable")
        bounds = np.searchsorted(buckets[order], np.arange(SPARSE_CLUSTER_BUCKETS + 1))
        groups = []
        for bucket in np.flatnonzero(np.diff(bounds)):
            index = order[bounds[bucket] : bounds[bucket + 1]]
            for start in range(0, len(index), self._chunk):
                groups.append(_Group(int(bucket), index[start : start + self._chunk]))
        return groups

    def _node(self, bucket: int) -> ClusterNode:
        node = node_for_slot(self._client, self._slots[bucket])
        if node is None:
            raise SparseTableUnavailable(f"{self._what}: no node serves bucket {bucket}")
        return node

    def _round(
        self,
        groups: list[_Group],
        build: Callable[[_Group], tuple[bytes, int]],
        transaction: bool = False,
    ) -> list[list[object]]:
        """Send each group's commands (``build``: packed bytes, command count); their replies.

        Per node, every group goes out in one write, to all nodes before any
        reply is read. A plain group's result is its replies; a
        transaction's is what ``EXEC`` returned. Refused groups are resent
        after a slot map refresh (see the module doc).
        """
        results: list[list[object]] = [[] for _ in groups]
        pending = list(range(len(groups)))
        for attempt in range(_ATTEMPTS):
            refused = self._send_and_read(groups, pending, build, transaction, results)
            if not refused:
                return results
            pending = refused
            with redis_errors(SparseTableUnavailable, f"{self._what}: slot map refresh"):
                refresh_slots(self._client)
            if attempt < len(_PAUSE_S):
                time.sleep(_PAUSE_S[attempt])
        raise SparseTableUnavailable(
            f"{self._what}: {len(pending)} bucket(s) still redirected after "
            f"{_ATTEMPTS} slot map refreshes (resharding in progress?)"
        )

    def _send_and_read(
        self,
        groups: list[_Group],
        pending: list[int],
        build: Callable[[_Group], tuple[bytes, int]],
        transaction: bool,
        results: list[list[object]],
    ) -> list[int]:
        by_node: dict[str, list[int]] = defaultdict(list)
        nodes: dict[str, ClusterNode] = {}
        for i in pending:
            node = self._node(groups[i].bucket)
            nodes[node.name] = node
            by_node[node.name].append(i)
        held: list[tuple[redis.ConnectionPool, AbstractConnection]] = []
        refused: list[int] = []
        try:
            counts: dict[int, int] = {}
            for name, members in by_node.items():
                pool = node_pool(nodes[name])
                conn: AbstractConnection = pool.get_connection()
                held.append((pool, conn))
                payload = []
                for i in members:
                    body, counts[i] = build(groups[i])
                    if transaction:
                        payload += [MULTI, body, EXEC]
                    else:
                        payload.append(body)
                conn.send_packed_command(payload)
            for (_, conn), members in zip(held, by_node.values(), strict=True):
                for i in members:
                    try:
                        results[i] = self._read(conn, counts[i], transaction)
                    except _Refused:
                        refused.append(i)
        except REDIS_FAILURES as exc:
            for _, conn in held:
                conn.disconnect()
            raise SparseTableUnavailable(f"{self._what}: {exc}") from exc
        except BaseException:
            for _, conn in held:
                conn.disconnect()  # replies still unread: the stream is out of step
            raise
        finally:
            for pool, conn in held:
                pool.release(conn)  # type: ignore[arg-type]
        return refused

    @staticmethod
    def _read(conn: AbstractConnection, count: int, transaction: bool) -> list[object]:
        """One group's replies, every one read (so the stream stays in step) before raising."""
        replies: list[object] = []
        for _ in range(count + 2 if transaction else count):
            try:
                replies.append(read_reply(conn))
            except redis.ResponseError as exc:
                replies.append(exc)
        errors = [r for r in replies if isinstance(r, Exception)]
        if transaction:
            result = replies[-1]
            if any(isinstance(e, _REDIRECTS) for e in errors):
                raise _Refused  # EXECABORT: nothing of this bucket was applied
            if errors:
                raise errors[0]  # type: ignore[misc]
            if not isinstance(result, list):
                raise redis.ResponseError(f"EXEC answered {result!r}")
            for item in result:
                if isinstance(item, Exception):
                    raise item
            return result
        if any(isinstance(e, _REDIRECTS) for e in errors):
            raise _Refused
        if errors:
            raise errors[0]  # type: ignore[misc]
        return replies

    def _decode(self, values: list[object], kind: Kind) -> tuple[Rows, Rows, np.ndarray]:
        """Weights, state and present mask of one bucket's ``MGET`` of rows."""
        return split_rows(values, self.spec.dim, self.state_width, self._what, kind)

    # --- SparseTable --------------------------------------------------

    def pull(self, keys: Keys, *, train: bool = False) -> Rows:
        keys = as_keys(keys)
        out = np.zeros((len(keys), self.spec.dim), dtype=np.float32)
        if not len(keys):
            return out
        kb = key_bytes(keys)
        groups = self._groups(keys)
        replies = self._round(groups, lambda g: (self._r[g.bucket].mget(kb[g.at]), 1))
        present = np.zeros(len(keys), dtype=bool)
        for group, reply in zip(groups, replies, strict=True):
            rows, _, ok = self._decode(reply[0], self._r[group.bucket])  # type: ignore[arg-type]
            out[group.at] = rows
            present[group.at] = ok
        if train and not present.all():
            missing = np.flatnonzero(~present)
            out[missing] = self._sight(keys[missing], kb[missing])
        return out

    def _sight(self, keys: Keys, kb: np.ndarray) -> Rows:
        """Count sightings of missing keys, admit those at the threshold; their rows."""
        rows = np.zeros((len(keys), self.spec.dim), dtype=np.float32)
        if self._threshold > 1:
            groups = self._groups(keys)
            replies = self._round(
                groups,
                lambda g: (
                    self._c[g.bucket].incr_pexpire(kb[g.at], self._ttl_ms),
                    2 * len(g.at),
                ),
            )
            counts = np.zeros(len(keys), dtype=np.int64)
            for group, reply in zip(groups, replies, strict=True):
                counts[group.at] = np.array(reply[0::2], dtype=np.int64)
            admit = np.flatnonzero(counts >= self._threshold)
        else:
            admit = np.arange(len(keys))
        if not len(admit):
            return rows
        new_keys, new_kb = keys[admit], kb[admit]
        weights = self._initializer(new_keys)
        raw = value_bytes(weights, self.optimizer.initial_state(len(new_keys), self.spec.dim))

        def admit_rows(g: _Group) -> tuple[bytes, int]:
            b, i = g.bucket, g.at
            body = self._r[b].set(new_kb[i], raw[i], self._ttl_ms, nx=True)
            if self._threshold > 1:
                body += self._c[b].simple(b"DEL", new_kb[i])
                return body, 2 * len(i)
            return body, len(i)

        groups = self._groups(new_keys)
        results = self._round(groups, admit_rows, transaction=True)
        created = np.zeros(len(new_keys), dtype=bool)
        for group, result in zip(groups, results, strict=True):
            created[group.at] = [r is not None for r in result[: len(group.at)]]
        with self._counter_lock:
            self._admissions += int(created.sum())
        if not created.all():
            # Another trainer created these rows a moment ago: return what it stored.
            lost = np.flatnonzero(~created)
            lost_kb = new_kb[lost]
            groups = self._groups(new_keys[lost])
            replies = self._round(groups, lambda g: (self._r[g.bucket].mget(lost_kb[g.at]), 1))
            for group, reply in zip(groups, replies, strict=True):
                theirs, _, there = self._decode(reply[0], self._r[group.bucket])  # type: ignore[arg-type]
                weights[lost[group.at[there]]] = theirs[there]
        rows[admit] = weights
        return rows

    def push(self, keys: Keys, grads: Rows) -> None:
        keys = as_keys(keys)
        grads = as_grads(grads, len(keys), self.spec.dim)
        if not len(keys):
            return
        kb = key_bytes(keys)
        groups = self._groups(keys)
        replies = self._round(groups, lambda g: (self._r[g.bucket].mget(kb[g.at]), 1))
        weights = np.zeros((len(keys), self.spec.dim), dtype=np.float32)
        state = np.zeros((len(keys), self.state_width), dtype=np.float32)
        present = np.zeros(len(keys), dtype=bool)
        for group, reply in zip(groups, replies, strict=True):
            w, s, ok = self._decode(reply[0], self._r[group.bucket])  # type: ignore[arg-type]
            weights[group.at], state[group.at], present[group.at] = w, s, ok
        kept = np.flatnonzero(present)  # not admitted or expired: the gradient is dropped
        if not len(kept):
            return
        new_w, new_s = self.optimizer.apply(weights[kept], state[kept], grads[kept])
        raw, kept_kb = value_bytes(new_w, new_s), kb[kept]

        def write(g: _Group) -> tuple[bytes, int]:
            return self._r[g.bucket].set(kept_kb[g.at], raw[g.at], self._ttl_ms), len(g.at)

        self._round(self._groups(keys[kept]), write, transaction=True)

    def expire(self, now_s: float | None = None) -> int:
        """Nothing to do: Redis expires rows itself (``PX`` on every write)."""
        return 0

    # --- whole-table operations ----------------------------------------

    def _pattern(self, kind: str) -> bytes:
        head = f"{REDIS_ROOT}:sp:{{{self.model}:{self.spec.name}:".encode()
        return glob_escape(head) + b"*}:" + kind.encode() + b":*"

    def _scan_names(self, kind: str) -> Iterator[tuple[ClusterNode, list[bytes]]]:
        """Pages of key names of ``kind`` on each primary (SCAN; a name may come twice)."""
        for node in self._client.get_primaries():
            client = node.redis_connection
            if client is None:
                raise SparseTableUnavailable(f"{self._what}: node {node.name} has no client")
            cursor = 0
            while True:
                cursor, names = client.scan(cursor, match=self._pattern(kind), count=self._chunk)
                if names:
                    yield node, [n for n in names if isinstance(n, bytes)]
                if cursor == 0:
                    break

    def _scan_keys(self) -> Keys:
        """Every key with a row, unique (8 bytes of memory per row)."""
        kinds = {kind.prefix: kind for kind in self._r}
        parts = []
        for _, names in self._scan_names(SPARSE_ROWS):
            mine = [n for n in names if n[:-8] in kinds and len(n) == kinds[n[:-8]].key_len]
            parts.append(np.frombuffer(b"".join(n[-8:] for n in mine), dtype=">u8"))
        if not parts:
            return np.zeros(0, dtype=np.uint64)
        return np.unique(np.concatenate(parts)).astype(np.uint64)

    def stats(self) -> TableStats:
        """Row count by SCAN of every primary (see :mod:`.redis` for its cost)."""
        with redis_errors(SparseTableUnavailable, self._what):
            rows = len(self._scan_keys())
        return TableStats(
            rows=rows,
            admissions=self._admissions,
            expirations=0,
            bytes=rows * self._value_bytes,
        )

    def export(self) -> SnapshotData:
        """Every row with its state and update time (from its remaining TTL)."""
        with redis_errors(SparseTableUnavailable, self._what):
            all_keys = self._scan_keys()
        key_parts, weight_parts, state_parts, updated_parts = [], [], [], []
        for start in range(0, len(all_keys), self._chunk):
            keys = all_keys[start : start + self._chunk]
            groups = self._groups(keys)
            replies = self._round(groups, self._read_with_ttl(key_bytes(keys)))
            now = time.time()
            weights = np.zeros((len(keys), self.spec.dim), dtype=np.float32)
            state = np.zeros((len(keys), self.state_width), dtype=np.float32)
            pttl = np.full(len(keys), -2.0)
            ok = np.zeros(len(keys), dtype=bool)
            for group, reply in zip(groups, replies, strict=True):
                w, s, row_ok = self._decode(reply[0], self._r[group.bucket])  # type: ignore[arg-type]
                weights[group.at], state[group.at], ok[group.at] = w, s, row_ok
                pttl[group.at] = np.array(reply[1:], dtype=np.float64)
            ok &= pttl != -2
            remaining_s = np.where(pttl >= 0, pttl / 1000.0, self._ttl_s)
            key_parts.append(keys[ok])
            weight_parts.append(weights[ok])
            state_parts.append(state[ok])
            updated_parts.append((now - (self._ttl_s - remaining_s))[ok])
        if not key_parts:
            return SnapshotData.empty(self.spec, self.state_width)
        return SnapshotData(
            self.spec,
            np.concatenate(key_parts),
            np.concatenate(weight_parts),
            np.concatenate(state_parts),
            np.concatenate(updated_parts),
        )

    def _read_with_ttl(self, kb: np.ndarray) -> Callable[[_Group], tuple[bytes, int]]:
        """Builder of one ``MGET`` of rows plus a ``PTTL`` per key."""

        def build(g: _Group) -> tuple[bytes, int]:
            r = self._r[g.bucket]
            return r.mget(kb[g.at]) + r.simple(b"PTTL", kb[g.at]), 1 + len(g.at)

        return build

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
        if not len(data.keys):
            return 0
        kb = key_bytes(data.keys)
        raw = value_bytes(data.weights, data.state)

        def write(g: _Group) -> tuple[bytes, int]:
            prefix = self._r[g.bucket].prefix
            parts = []
            for i in g.at.tolist():
                ttl = b"%d" % remaining_ms[i]
                parts.append(pack(b"SET", prefix + kb[i].tobytes(), raw[i].tobytes(), b"PX", ttl))
            return b"".join(parts), len(g.at)

        self._round(self._groups(data.keys), write, transaction=True)
        return len(data.keys)

    def clear(self) -> None:
        with redis_errors(SparseTableUnavailable, self._what):
            for kind in (SPARSE_ROWS, SPARSE_SIGHTINGS):
                for node, names in self._scan_names(kind):
                    pipe = node.redis_connection.pipeline(transaction=False)  # type: ignore[union-attr]
                    for name in names:  # one key per UNLINK: names span slots
                        pipe.unlink(name)
                    pipe.execute()

    def close(self) -> None:
        """Close the client if this table owns it; a borrowed client stays open."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> ClusterSparseTable:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterSparseTable({self.model!r}/{self.spec.name!r}, dim={self.spec.dim})"
