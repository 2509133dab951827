"""In-process sparse table: numpy rows plus a numpy hash index from key to slot.

The embedded default: one process trains and serves, a trainer thread pushes
while API threads pull. Layout::

    _weights  float32 [capacity, dim]
    _state    float32 [capacity, state_width]
    _updated  float64 [capacity]      Unix seconds of the last update (+inf: free slot)
    _keys     uint64  [capacity]      key held by each slot (to unindex on removal)
    _index    KeyIndex                key -> slot, open addressing in numpy arrays
    _free     list[int]               slots released by expiry, reused first

Slot 0 is a permanent row of zeros that is never indexed: a missing key
looks up slot 0, so a pull is one vectorized index probe and one ``np.take``
with no per-key Python at all. Capacity doubles when full, so a batch of any
size fits.

The index is a :class:`~feature_store.sparse.key_index.KeyIndex` (why not a
``dict``: see its module).

One lock serializes every call. Pulls and pushes are short (a few hundred
microseconds for 4,096 keys) and the optimizer runs under the lock, so this
backend is stronger than the last-writer-wins contract: no update is lost.

Expiry is checked on read (a stale row pulls as missing and is released)
and swept by :meth:`MemorySparseTable.expire`; the trainer calls it now and
then. Admission counters live in a dict of ``key -> (sightings, last
sighting)`` (only keys not yet admitted, so it stays small) and expire after
``ttl_s`` too. Inject ``clock`` to test expiry without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import numpy as np

from feature_store.errors import InvalidInput
from feature_store.settings import SparseSettings
from feature_store.sparse.base import Keys, Rows, TableSpec, TableStats
from feature_store.sparse.initializers import Initializer
from feature_store.sparse.key_index import KeyIndex
from feature_store.sparse.optimizers import as_grads, as_keys, make_optimizer
from feature_store.sparse.snapshot import SnapshotData, read_snapshot, write_snapshot

_ZERO_SLOT = 0
class MemorySparseTable:
    """A :class:`~feature_store.sparse.base.SparseTable` held in numpy arrays."""

    def __init__(
        self,
        spec: TableSpec,
        settings: SparseSettings,
        *,
        clock: Callable[[], float] = time.time,
        initial_capacity: int = 1024,
    ) -> None:
        self.spec = spec
        self.optimizer = make_optimizer(spec.optimizer, settings)
        self.state_width = self.optimizer.state_width(spec.dim)
        self._initializer = Initializer(
            spec.name, spec.dim, settings.init_scale, self.optimizer.zero_init, spec.preset
        )
        self._threshold = settings.admission_threshold
        self._ttl_s = settings.ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._admissions = 0
        self._expirations = 0
        self._reset(max(2, initial_capacity))

    # --- storage ------------------------------------------------------

    def _reset(self, capacity: int) -> None:
        self._weights = np.zeros((capacity, self.spec.dim), dtype=np.float32)
        self._state = np.zeros((capacity, self.state_width), dtype=np.float32)
        self._updated = np.full(capacity, np.inf, dtype=np.float64)
        self._keys = np.zeros(capacity, dtype=np.uint64)
        self._index = KeyIndex()
        self._free: list[int] = []
        self._top = 1  # next never-used slot; slot 0 is the zero row
        self._sightings: dict[int, tuple[int, float]] = {}

    def _grow(self, needed: int) -> None:
        capacity = len(self._updated)
        if needed <= capacity:
            return
        new_capacity = max(capacity * 2, needed)
        top = self._top

        def grown(old: np.ndarray, fill: float) -> np.ndarray:
            new = np.full((new_capacity, *old.shape[1:]), fill, dtype=old.dtype)
            new[:top] = old[:top]
            return new

        self._weights = grown(self._weights, 0.0)
        self._state = grown(self._state, 0.0)
        self._updated = grown(self._updated, np.inf)
        self._keys = grown(self._keys, 0)

    def _allocate(self, count: int) -> np.ndarray:
        reused = min(count, len(self._free))
        slots = self._free[len(self._free) - reused :]
        del self._free[len(self._free) - reused :]
        fresh = count - reused
        self._grow(self._top + fresh)
        new = np.arange(self._top, self._top + fresh, dtype=np.intp)
        self._top += fresh
        return np.concatenate((np.asarray(slots, dtype=np.intp), new))

    def _release(self, slots: np.ndarray) -> None:
        self._index.remove(self._keys[slots])
        self._weights[slots] = 0.0
        self._state[slots] = 0.0
        self._updated[slots] = np.inf
        self._free.extend(slots.tolist())
        self._expirations += len(slots)

    def _lookup(self, keys: Keys, now: float) -> np.ndarray:
        """Slots of ``keys`` (0 for missing); rows past their TTL are released and read as 0."""
        slots, _ = self._index.find(keys)
        stale = self._updated.take(slots) <= now - self._ttl_s
        if stale.any():
            self._release(np.unique(slots[stale]))  # unique: a repeated key must not free twice
            slots[stale] = _ZERO_SLOT
        return slots

    # --- SparseTable --------------------------------------------------

    def pull(self, keys: Keys, *, train: bool = False) -> Rows:
        keys = as_keys(keys)
        with self._lock:
            now = self._clock()
            slots = self._lookup(keys, now)
            if train:
                missing = np.flatnonzero(slots == _ZERO_SLOT)
                if len(missing):
                    slots[missing] = self._sight(keys[missing], now)
            return self._weights.take(slots, axis=0)

    def _sight(self, keys: Keys, now: float) -> np.ndarray:
        """Count a sighting of each missing key; admit those at the threshold.

        Returns the slot of each key: its new slot if admitted, else 0.
        """
        if self._threshold <= 1:
            admit = np.ones(len(keys), dtype=bool)
        else:
            admit = np.zeros(len(keys), dtype=bool)
            cutoff = now - self._ttl_s
            sightings = self._sightings
            for i, key in enumerate(keys.tolist()):
                seen = sightings.get(key)
                count = 1 if seen is None or seen[1] <= cutoff else seen[0] + 1
                if count >= self._threshold:
                    admit[i] = True
                    sightings.pop(key, None)
                else:
                    sightings[key] = (count, now)
        result = np.zeros(len(keys), dtype=np.intp)
        if admit.any():
            new_keys = keys[admit]
            if len(np.unique(new_keys)) != len(new_keys):
                raise InvalidInput(
                    "keys", "duplicate keys in one batch; deduplicate with np.unique"
                )
            slots = self._allocate(len(new_keys))
            self._weights[slots] = self._initializer(new_keys)
            self._state[slots] = self.optimizer.initial_state(len(new_keys), self.spec.dim)
            self._updated[slots] = now
            self._keys[slots] = new_keys
            self._index.insert(new_keys, slots)
            self._admissions += len(new_keys)
            result[admit] = slots
        return result

    def push(self, keys: Keys, grads: Rows) -> None:
        keys = as_keys(keys)
        grads = as_grads(grads, len(keys), self.spec.dim)
        with self._lock:
            now = self._clock()
            slots = self._lookup(keys, now)
            present = slots != _ZERO_SLOT
            if not present.all():  # not admitted (or expired): the gradient is dropped
                slots = slots[present]
                grads = grads[present]
            if not len(slots):
                return
            weights, state = self.optimizer.apply(
                self._weights.take(slots, axis=0), self._state.take(slots, axis=0), grads
            )
            self._weights[slots] = weights
            self._state[slots] = state
            self._updated[slots] = now

    def expire(self, now_s: float | None = None) -> int:
        with self._lock:
            now = self._clock() if now_s is None else now_s
            cutoff = now - self._ttl_s
            stale = np.flatnonzero(self._updated[: self._top] <= cutoff)
            if len(stale):
                self._release(stale)
            old = [k for k, (_, seen) in self._sightings.items() if seen <= cutoff]
            for key in old:
                del self._sightings[key]
            return len(stale)

    def stats(self) -> TableStats:
        with self._lock:
            cutoff = self._clock() - self._ttl_s
            stale = int((self._updated[: self._top] <= cutoff).sum())
            rows = len(self._index) - stale
            return TableStats(
                rows=rows,
                admissions=self._admissions,
                expirations=self._expirations,
                bytes=rows * (self.spec.dim + self.state_width) * 4,
            )

    def export(self) -> SnapshotData:
        """A copy of every live row, in snapshot form."""
        with self._lock:
            updated = self._updated[: self._top]
            slots = np.flatnonzero(np.isfinite(updated) & (updated > self._clock() - self._ttl_s))
            return SnapshotData(
                spec=self.spec,
                keys=self._keys[slots],
                weights=self._weights[slots],
                state=self._state[slots],
                updated_at=self._updated[slots],
            )

    def snapshot(self, directory: Path) -> None:
        write_snapshot(directory, self.export())

    def restore(self, directory: Path) -> int:
        data = read_snapshot(directory, self.spec, self.state_width)
        return self.load(data)

    def load(self, data: SnapshotData) -> int:
        """Replace the contents with ``data`` (rows already past their TTL are skipped)."""
        if data.state.shape[1] != self.state_width:
            raise InvalidInput(
                "snapshot.state", f"width {data.state.shape[1]}, want {self.state_width}"
            )
        if len(np.unique(data.keys)) != len(data.keys):
            raise InvalidInput("snapshot.keys", "duplicate keys")
        with self._lock:
            data = data.live(self._clock(), self._ttl_s)
            n = len(data.keys)
            self._reset(max(2 * (n + 1), 1024))
            self._weights[1 : n + 1] = data.weights
            self._state[1 : n + 1] = data.state
            self._updated[1 : n + 1] = data.updated_at
            self._keys[1 : n + 1] = data.keys
            self._index = KeyIndex(n)
            self._index.insert(data.keys, np.arange(1, n + 1, dtype=np.intp))
            self._top = n + 1
            return n

    def clear(self) -> None:
        with self._lock:
            self._reset(1024)

    def close(self) -> None:
        """Nothing to release; the arrays go with the object."""

    def __enter__(self) -> MemorySparseTable:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MemorySparseTable({self.spec.name!r}, dim={self.spec.dim}, rows={len(self._index)})"
        )
