"""A short-TTL in-process cache of hot reads, for the Redis backends.

With Redis stores and tables a 500-candidate request reads 500 catalog
records (JSON to decode and validate), 500 counter hashes and ~3,000 sparse
rows: most of its time. The same hot videos and feature rows recur across
requests, so each serving process keeps what it read for ``ttl_ms``
(``api.hot_row_cache_ttl_ms``) and asks Redis only for the rest. Sparse rows
and the candidate sources' catalog reads are cached here; the scorer's
per-video rows (:mod:`app.scoring.video_table`) keep catalog fields and
counters under the same bounds (:attr:`CachedReads.catalog_ttl_s`,
:attr:`CachedReads.stats_ttl_s`).

Freshness: a sparse row or a counter served is at most ``ttl_ms``
older than Redis, so with the default 500 ms the event-to-served-row time
stays far inside its 2 s goal (see docs/benchmarks.md). Catalog records
change rarely and cost the most to read (one JSON document to decode and
validate per video), so they are kept longer: :data:`CATALOG_TTL_S` (or
``ttl_ms`` if longer). An upsert or a hide through this process drops the
records from the cache at once; one through another process (another API
replica, a catalog import) takes effect here within :data:`CATALOG_TTL_S`:
for that long a replica may still propose a video hidden elsewhere, or score
a video with its old category, tags or duration.

The in-process (memory) backends are read directly: their reads are already
dict and array lookups, and a cache would only add staleness.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from itertools import repeat
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from feature_store.catalog.base import CatalogStore, Video
from feature_store.changelog import ChangeLog
from feature_store.sparse.base import SparseTable
from feature_store.sparse.key_index import KeyIndex
from feature_store.sparse.steps import pull_many

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

CATALOG_TTL_S = 5.0
"""How long a catalog record read from Redis is reused (staleness across processes)."""
MAX_ENTRIES = 500_000
"""Entries per cache before it is emptied (a crude bound on memory)."""
BIG_LOOKUP = 256
"""Keys from which a row cache's lookup probes its :class:`KeyIndex` instead of its dict
(where the two cost the same, measured on the 2-core reference machine)."""


Clock = Callable[[], float]
"""Monotonic seconds (``time.monotonic``; tests pass a clock they move by hand)."""


class TtlCache(Generic[K, V]):
    """Values by key, fetched in bulk on a miss and kept for ``ttl_s`` of ``clock``."""

    def __init__(
        self, ttl_s: float, max_entries: int = MAX_ENTRIES, clock: Clock = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[K, tuple[float, V]] = {}

    def get_many(self, keys: Sequence[K], fetch: Callable[[list[K]], list[V]]) -> list[V]:
        now = self.clock()
        entries = self._entries
        found = [entries.get(k) for k in keys]
        missing = [i for i, e in enumerate(found) if e is None or e[0] < now]
        out: list[V] = [e[1] if e is not None else None for e in found]  # type: ignore[misc]
        if missing:
            fetched = fetch([keys[i] for i in missing])
            if len(entries) + len(missing) > self.max_entries:
                entries.clear()
            expires = now + self.ttl_s
            for i, value in zip(missing, fetched, strict=True):
                out[i] = value
                entries[keys[i]] = (expires, value)
        return out

    def invalidate(self, keys: Iterable[K]) -> None:
        for key in keys:
            self._entries.pop(key, None)


class RowCache:
    """Sparse rows of one table: a key index to slots of one float32 matrix.

    Hits are gathered with one fancy index, so a 3,000-key pull costs one index
    probe, not 3,000 small array copies. The index is a dict (a Python call per
    key: about 0.19 us a key) until a lookup asks for :data:`BIG_LOOKUP` keys or
    more (a table of the candidates' side: their ids, title tokens, tags; up to
    thousands of keys a request); from then on it is a
    :class:`~feature_store.sparse.key_index.KeyIndex` (a dozen numpy calls whatever
    the count, about 45 us, then 0.02 us a key). A table of the user's side (a
    key or two a request) keeps its dict. One lock per table: slot allocation must
    not interleave (the dashboard also asks for recommendations, from a thread-pool
    thread), and uncontended it costs nothing measurable.
    """

    def __init__(
        self,
        table: SparseTable,
        ttl_s: float,
        capacity: int = 262_144,
        clock: Clock = time.monotonic,
    ) -> None:
        self.table = table
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.clock = clock
        self._slots: dict[int, int] | None = {}
        """Key -> slot, until the first big lookup (then None)."""
        self._index: KeyIndex | None = None
        """Key -> slot + 1, from the first big lookup on (None before)."""
        self._expires = np.zeros(capacity, dtype=np.float64)
        """``clock`` time each slot's row is good until."""
        self._rows = np.zeros((capacity, table.spec.dim), dtype=np.float32)
        self._next = 0
        self._lock = threading.Lock()

    def pull(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        rows, miss = self.lookup(keys)
        if len(miss):
            missing = keys[miss]
            fetched = self.table.pull(missing, train=False)
            rows[miss] = fetched
            self.store(missing, fetched)
        return rows

    def lookup(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]]:
        """The rows of ``keys`` held and fresh, and the positions of the others (their
        rows left unset: the caller reads them from the table and keeps them with :meth:`store`)."""
        with self._lock:
            now = self.clock()
            slot = self._find(keys)
            hit = slot >= 0
            hit[hit] = self._expires[slot[hit]] >= now
            if hit.all():
                return self._rows[slot], np.zeros(0, dtype=np.intp)
            out = np.empty((len(keys), self.table.spec.dim), dtype=np.float32)
            out[hit] = self._rows[slot[hit]]
            return out, np.flatnonzero(~hit)

    def _find(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Each key's slot, -1 where none (under the lock)."""
        n, slots = len(keys), self._slots
        if slots is not None and n >= BIG_LOOKUP:  # the first big lookup: index what is held
            self._index = KeyIndex(len(slots))
            if slots:
                held = np.fromiter(slots.keys(), np.uint64, len(slots))
                self._index.insert(held, np.fromiter(slots.values(), np.intp, len(slots)) + 1)
            self._slots = slots = None
        if slots is not None:
            return np.fromiter(map(slots.get, keys.tolist(), repeat(-1, n)), np.int64, n)
        assert self._index is not None
        found, _ = self._index.find(keys)
        return found.astype(np.int64) - 1

    def store(self, keys: npt.NDArray[np.uint64], rows: npt.NDArray[np.float32]) -> None:
        """Keep ``rows`` (just read) of ``keys`` for ``ttl_s``."""
        m = len(keys)
        if not m or m > self.capacity:
            return
        with self._lock:
            if self._next + m > self.capacity:
                self._slots = None if self._slots is None else {}
                self._index = None if self._index is None else KeyIndex()
                self._next = 0
            start = self._next
            self._rows[start : start + m] = rows
            self._expires[start : start + m] = self.clock() + self.ttl_s
            if self._slots is not None:
                self._slots.update(zip(keys.tolist(), range(start, start + m), strict=True))
            else:
                assert self._index is not None
                unique, first = np.unique(keys, return_index=True)
                self._index.put(unique, start + first + 1)
            self._next += m


class RowReader:
    """Reads sparse rows of one family's tables by table name, through their
    :class:`RowCache` each when caching is on.

    :meth:`many` reads several tables at once: what none of the caches holds
    is pulled from all the tables interleaved
    (:func:`feature_store.sparse.steps.pull_many`), so a request's dozen Redis
    tables cost about one round trip instead of one each. On a loaded machine
    each round trip also waits for Redis and then this thread to be scheduled
    again, so this is most of a Redis-backed request's wait
    (docs/benchmarks.md, "Serving speed (issue #24)").
    """

    def __init__(
        self, tables: Mapping[str, SparseTable], caches: Mapping[str, RowCache] | None
    ) -> None:
        self.tables = tables
        self.caches = caches
        """Per table (None: not cached, every read goes to the table)."""

    def __call__(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        return self.many({table: keys})[table]

    def many(
        self, wanted: Mapping[str, npt.NDArray[np.uint64]]
    ) -> dict[str, npt.NDArray[np.float32]]:
        """The rows of each table's keys."""
        out: dict[str, npt.NDArray[np.float32]] = {}
        misses: dict[str, npt.NDArray[np.intp] | None] = {}
        """Per table to read: the positions read (None: all of them)."""
        for name, keys in wanted.items():
            if self.caches is None:
                misses[name] = None
                continue
            out[name], miss = self.caches[name].lookup(keys)
            if len(miss):
                misses[name] = miss
        if not misses:
            return out
        requests = [
            (self.tables[name], wanted[name] if miss is None else wanted[name][miss])
            for name, miss in misses.items()
        ]
        pulled = pull_many(requests, train=False)
        for (name, at), (_, keys), rows in zip(misses.items(), requests, pulled, strict=True):
            if at is None:
                out[name] = rows
                continue
            out[name][at] = rows
            assert self.caches is not None
            self.caches[name].store(keys, rows)
        return out


class CachedReads:
    """The serving path's cached reads of catalog records (candidate sources) and sparse rows."""

    def __init__(
        self,
        catalog: CatalogStore,
        tables: Mapping[str, SparseTable],
        ttl_ms: int,
        enabled: bool,
        clock: Clock = time.monotonic,
    ) -> None:
        self.catalog = catalog
        self.clock = clock
        self.tables = tables
        self.enabled = enabled and ttl_ms > 0
        ttl_s = ttl_ms / 1000
        self.catalog_ttl_s = max(ttl_s, CATALOG_TTL_S) if self.enabled else 0.0
        """How long a catalog record read is reused (0: not cached)."""
        self.stats_ttl_s = ttl_s if self.enabled else 0.0
        """How long counters and sparse rows read are reused (0: not cached)."""
        self._videos: TtlCache[str, Video | None] = TtlCache(
            max(ttl_s, CATALOG_TTL_S), clock=clock
        )
        self._ttl_s = ttl_s
        self.rows = self._reader(tables)
        """The row reader of this process's own tables."""
        self.forgotten = ChangeLog()
        """Ids of the catalog records written through this process, in order."""
        self._family_rows: dict[int, RowReader] = {}

    def videos(self, video_ids: Sequence[str]) -> list[Video | None]:
        if not self.enabled:
            return self.catalog.get_many(video_ids)
        return self._videos.get_many(video_ids, self.catalog.get_many)

    def pull(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        return self.rows(table, keys)

    def reader(self, tables: Mapping[str, SparseTable]) -> RowReader:
        """A row reader over another family's ``tables``, cached like :meth:`pull`.

        Each family has its own row caches (the same key means a different row
        in another family); they are kept while the process lives (a handful
        of families at most: one per retrain served).
        """
        if tables is self.tables:
            return self.rows
        if not self.enabled:
            return RowReader(tables, None)
        reader = self._family_rows.get(id(tables))
        if reader is None:
            reader = self._family_rows[id(tables)] = self._reader(tables)
        return reader

    def _reader(self, tables: Mapping[str, SparseTable]) -> RowReader:
        if not self.enabled:
            return RowReader(tables, None)
        caches = {
            name: RowCache(table, self._ttl_s, clock=self.clock) for name, table in tables.items()
        }
        return RowReader(tables, caches)

    def forget_videos(self, video_ids: Iterable[str]) -> None:
        """Drop cached catalog records (after a write through this process).

        Also logged in :attr:`forgotten`, which serving's per-video arrays
        (:mod:`app.scoring.video_table`) follow.
        """
        ids = list(video_ids)
        self._videos.invalidate(ids)
        self.forgotten.append(ids)
