"""Recently trained event ids, so a redelivered event is not trained twice.

At-least-once delivery means an event may come back: after a restart from a
checkpoint older than the broker's committed position, or when a producer
retries. The window remembers the last ``capacity`` event ids (FIFO) and is
saved in every checkpoint, so the guarantee survives restarts; an id older
than the window is no longer recognised (size the window to cover at least
one checkpoint interval of traffic, see ``docs/training.md``).

Ids are kept as 64-bit xxh3 hashes: 8 bytes each in the checkpoint (about
100 bytes each in memory, as a Python int in a set and a deque: ~50 MB for
the default 500,000) and a collision chance of about n^2 / 2^65 (3e-8 for a
million ids), which would drop one event, never train one twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import xxhash


def id_hash(event_id: str) -> int:
    return xxhash.xxh3_64_intdigest(event_id.encode())


class DedupeWindow:
    """A bounded FIFO set of event-id hashes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._order: deque[int] = deque()
        self._seen: set[int] = set()
        self.duplicates = 0
        """Events dropped as already seen, since creation."""

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, event_id: str) -> bool:
        return id_hash(event_id) in self._seen

    def admit(self, event_ids: Sequence[str]) -> list[int]:
        """Positions in ``event_ids`` that are new (and now remembered); repeats are dropped.

        A repeat inside ``event_ids`` itself counts as a duplicate too.
        """
        if self.capacity == 0:
            return list(range(len(event_ids)))
        seen = self._seen
        order = self._order
        fresh: list[int] = []
        for i, event_id in enumerate(event_ids):
            h = xxhash.xxh3_64_intdigest(event_id.encode())
            if h in seen:
                continue
            seen.add(h)
            order.append(h)
            fresh.append(i)
        self.duplicates += len(event_ids) - len(fresh)
        overflow = len(order) - self.capacity
        for _ in range(max(0, overflow)):
            seen.discard(order.popleft())
        return fresh

    def remember(self, hashes: Iterable[int]) -> None:
        """Add already-hashed ids (restored from a checkpoint or journal)."""
        for h in hashes:
            if h not in self._seen:
                self._seen.add(h)
                self._order.append(h)
        while len(self._order) > self.capacity:
            self._seen.discard(self._order.popleft())

    def forget(self, event_ids: Sequence[str]) -> None:
        """Drop ``event_ids`` (admitted for a batch that was then given back untrained:
        they must train when they come again). O(window): a rare path."""
        if not event_ids:
            return
        drop = {id_hash(i) for i in event_ids} & self._seen
        if drop:
            self._seen -= drop
            self._order = deque(h for h in self._order if h not in drop)

    def to_array(self) -> npt.NDArray[np.uint64]:
        """Hashes oldest first, for the checkpoint."""
        return np.fromiter(self._order, dtype=np.uint64, count=len(self._order))

    def load_array(self, hashes: npt.NDArray[np.uint64]) -> None:
        self._order.clear()
        self._seen.clear()
        self.remember(int(h) for h in hashes.tolist())
