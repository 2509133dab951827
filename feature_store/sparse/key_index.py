"""A hash map from uint64 keys to positive ints in numpy arrays, probed a batch at a time.

Why not a ``dict``: a dict lookup of a random 64-bit key in a table of 100k
entries costs 4 dependent cache misses (index, entry, key object, value object)
and a Python call per key; measured on the 2-core reference machine it capped
sparse pulls at 1.6-2 million keys/s. :class:`KeyIndex` probes all keys of a batch
at once in C loops (numpy gathers overlap their cache misses): over 10 million
keys/s (``bench/bench_sparse.py``). Its fixed cost is a dozen numpy calls (about
40 us), so for a few dozen keys a dict is quicker.

The in-process sparse table (:mod:`feature_store.sparse.memory`) indexes its rows
with it, and serving's row cache (:mod:`app.cache`) its hot rows.
"""

from __future__ import annotations

import numpy as np

from feature_store.sparse.base import Keys

_FIB = np.uint64(0x9E3779B97F4A7C15)
"""2**64 / golden ratio: Fibonacci hashing spreads keys over the high bits."""
_EMPTY = 0
_TOMBSTONE = -1


class KeyIndex:
    """A hash map uint64 -> slot (> 0) in two numpy arrays, probed a batch at a time.

    Open addressing with linear probing; the home position of a key is the top
    ``bits`` bits of ``key * 0x9E3779B97F4A7C15`` (Fibonacci hashing). Values
    are slots ``> 0``; ``0`` marks an empty position and ``-1`` a tombstone
    (a removed key: probes go on past it, inserts reuse it). The load (keys
    plus tombstones) stays at most 1/2, so probe chains are short; each probe
    round is a handful of numpy operations over the keys still searching.
    Not thread-safe: the table's lock guards it.
    """

    def __init__(self, expected: int = 0) -> None:
        self._alloc(max(10, (4 * expected).bit_length()))
        self.used = 0

    def _alloc(self, bits: int) -> None:
        self._mask = (1 << bits) - 1
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._vals = np.zeros(1 << bits, dtype=np.intp)
        self._tombstones = 0

    def __len__(self) -> int:
        return self.used

    def _home(self, keys: Keys) -> np.ndarray:
        return ((keys * _FIB) >> self._shift).astype(np.intp)

    def find(self, keys: Keys) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, positions)`` of ``keys``: slot 0 and position -1 where absent."""
        pos = self._home(keys)
        vals, table_keys, mask = self._vals, self._keys, self._mask
        found = vals.take(pos)
        hit = (table_keys.take(pos) == keys) & (found > 0)
        slots = np.where(hit, found, 0)
        where = np.where(hit, pos, -1)
        pending = np.flatnonzero(~hit & (found != _EMPTY))
        while len(pending):
            probe = (pos[pending] + 1) & mask
            pos[pending] = probe
            found = vals.take(probe)
            hit = (table_keys.take(probe) == keys[pending]) & (found > 0)
            slots[pending[hit]] = found[hit]
            where[pending[hit]] = probe[hit]
            pending = pending[~hit & (found != _EMPTY)]
        return slots, where

    def insert(self, keys: Keys, slots: np.ndarray) -> None:
        """Add ``keys`` (unique, none already present) pointing at ``slots``."""
        self._reserve(len(keys))
        pos = self._home(keys)
        pending = np.arange(len(keys))
        while len(pending):
            probe = pos[pending]
            free = np.flatnonzero(self._vals.take(probe) <= _EMPTY)
            # Several pending keys may reach the same free position: the first takes it.
            taken, first = np.unique(probe[free], return_index=True)
            winners = free[first]
            self._tombstones -= int((self._vals[taken] == _TOMBSTONE).sum())
            self._keys[taken] = keys[pending[winners]]
            self._vals[taken] = slots[pending[winners]]
            left = np.ones(len(pending), dtype=bool)
            left[winners] = False
            pending = pending[left]
            pos[pending] = (pos[pending] + 1) & self._mask
        self.used += len(keys)

    def put(self, keys: Keys, slots: np.ndarray) -> None:
        """Point ``keys`` (unique) at ``slots``: present ones are moved, the others added."""
        _, where = self.find(keys)
        present = where >= 0
        self._vals[where[present]] = slots[present]
        if not present.all():
            self.insert(keys[~present], slots[~present])

    def remove(self, keys: Keys) -> None:
        """Drop ``keys`` (absent ones are ignored)."""
        _, where = self.find(keys)
        where = np.unique(where[where >= 0])
        self._vals[where] = _TOMBSTONE
        self._tombstones += len(where)
        self.used -= len(where)

    def _reserve(self, extra: int) -> None:
        if 2 * (self.used + self._tombstones + extra) <= self._mask + 1:
            return
        live = np.flatnonzero(self._vals > 0)
        keys, vals = self._keys[live], self._vals[live]
        self._alloc(max(10, (4 * (self.used + extra)).bit_length()))
        self.used = 0
        if len(keys):
            self.insert(keys, vals)
