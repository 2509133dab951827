"""A short-TTL in-process cache of hot reads, for the Redis backends.

With Redis stores and tables a 500-candidate request reads 500 catalog
records (JSON to decode and validate), 500 counter hashes and ~3,000 sparse
rows: most of its time. The same hot videos and feature rows recur across
requests, so each serving process keeps what it read for ``ttl_ms``
(``api.hot_row_cache_ttl_ms``) and asks Redis only for the rest.

Freshness: a row, record or counter served from here is at most ``ttl_ms``
older than Redis, so with the default 500 ms the event-to-served-row time
stays far inside its 2 s goal (see docs/benchmarks.md). Hiding a video
through this process drops it from the cache at once; a hide through another
process takes effect here within ``ttl_ms``.

The in-process (memory) backends are read directly: their reads are already
dict and array lookups, and a cache would only add staleness.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import ActivityStore, VideoStats
from feature_store.catalog.base import CatalogStore, Video
from feature_store.sparse.base import SparseTable

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_ENTRIES = 500_000
"""Entries per cache before it is emptied (a crude bound on memory)."""


class TtlCache(Generic[K, V]):
    """Values by key, fetched in bulk on a miss and kept for ``ttl_s``."""

    def __init__(self, ttl_s: float, max_entries: int = MAX_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}

    def get_many(self, keys: Sequence[K], fetch: Callable[[list[K]], list[V]]) -> list[V]:
        now = time.monotonic()
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
    """Sparse rows of one table: a dict from key to a slot of one float32 matrix.

    Hits are gathered with one fancy index, so a 3,000-key pull costs a dict
    pass, not 3,000 small array copies. One lock per table: slot allocation
    must not interleave (the dashboard also asks for recommendations, from a
    thread-pool thread), and uncontended it costs nothing measurable.
    """

    def __init__(self, table: SparseTable, ttl_s: float, capacity: int = 262_144) -> None:
        self.table = table
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._slots: dict[int, tuple[float, int]] = {}
        self._rows = np.zeros((capacity, table.spec.dim), dtype=np.float32)
        self._next = 0
        self._lock = threading.Lock()

    def pull(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        with self._lock:
            return self._pull(keys)

    def _pull(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        now = time.monotonic()
        slots = self._slots
        found = [slots.get(k) for k in keys.tolist()]
        hit = [i for i, e in enumerate(found) if e is not None and e[0] >= now]
        out = np.empty((len(keys), self.table.spec.dim), dtype=np.float32)
        if hit:
            out[hit] = self._rows[[found[i][1] for i in hit]]  # type: ignore[index]
        if len(hit) == len(keys):
            return out
        hit_set = set(hit)
        miss = [i for i in range(len(keys)) if i not in hit_set]
        rows = self.table.pull(keys[miss], train=False)
        out[miss] = rows
        if self._next + len(miss) > self.capacity:
            slots.clear()
            self._next = 0
        if len(miss) <= self.capacity:
            start = self._next
            self._rows[start : start + len(miss)] = rows
            expires = now + self.ttl_s
            for j, i in enumerate(miss):
                slots[int(keys[i])] = (expires, start + j)
            self._next += len(miss)
        return out


class CachedReads:
    """The serving path's reads of the catalog, the counters and the sparse rows."""

    def __init__(
        self,
        catalog: CatalogStore,
        activity: ActivityStore,
        tables: Mapping[str, SparseTable],
        ttl_ms: int,
        enabled: bool,
    ) -> None:
        self.catalog = catalog
        self.activity = activity
        self.tables = tables
        self.enabled = enabled and ttl_ms > 0
        ttl_s = ttl_ms / 1000
        self._videos: TtlCache[str, Video | None] = TtlCache(ttl_s)
        self._stats: TtlCache[str, VideoStats] = TtlCache(ttl_s)
        self._ttl_s = ttl_s
        self._rows = {name: RowCache(table, ttl_s) for name, table in tables.items()}
        self._family_rows: dict[int, dict[str, RowCache]] = {}

    def videos(self, video_ids: Sequence[str]) -> list[Video | None]:
        if not self.enabled:
            return self.catalog.get_many(video_ids)
        return self._videos.get_many(video_ids, self.catalog.get_many)

    def stats(self, video_ids: Sequence[str]) -> list[VideoStats]:
        if not self.enabled:
            return self.activity.video_stats(video_ids)
        return self._stats.get_many(video_ids, self.activity.video_stats)

    def pull(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        if not self.enabled:
            return self.tables[table].pull(keys, train=False)
        return self._rows[table].pull(keys)

    def reader(
        self, tables: Mapping[str, SparseTable]
    ) -> Callable[[str, npt.NDArray[np.uint64]], npt.NDArray[np.float32]]:
        """A row reader over another family's ``tables``, cached like :meth:`pull`.

        Each family has its own row caches (the same key means a different row
        in another family); they are kept while the process lives (a handful
        of families at most: one per retrain served).
        """
        if tables is self.tables:
            return self.pull
        if not self.enabled:
            return lambda table, keys: tables[table].pull(keys, train=False)
        caches = self._family_rows.get(id(tables))
        if caches is None:
            caches = {name: RowCache(table, self._ttl_s) for name, table in tables.items()}
            self._family_rows[id(tables)] = caches
        return lambda table, keys: caches[table].pull(keys)

    def forget_videos(self, video_ids: Iterable[str]) -> None:
        """Drop cached catalog records (after a write through this process)."""
        self._videos.invalidate(video_ids)
