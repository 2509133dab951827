"""Which ids changed, in order: lets a reader that caches per-id values refresh only those.

Serving keeps catalog fields and counters of the videos it scores in numpy
arrays (:mod:`app.scoring.video_table`), so that a 500-candidate request
costs one dict pass instead of a store read per video. The in-process stores
append the ids they change here; the reader remembers the sequence number
it has seen and asks :meth:`ChangeLog.since` for what came after. Stores in
Redis have no log: readers of those expire their copies after a TTL instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class ChangeLog:
    """An append-only, bounded sequence of changed ids.

    Sequence numbers count ids appended since creation. A reader more than
    ``capacity`` ids behind is told it lost track (``since`` returns None
    for the ids) and must treat everything as changed.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._ids: list[str] = []
        self._first = 0
        """Sequence number of ``_ids[0]``."""
        self._lock = threading.Lock()

    @property
    def seq(self) -> int:
        """Ids appended so far."""
        return self._first + len(self._ids)

    def append(self, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids.extend(ids)
            if len(self._ids) > 2 * self.capacity:  # trim in halves: amortised O(1)
                drop = len(self._ids) - self.capacity
                del self._ids[:drop]
                self._first += drop

    def everything_changed(self) -> None:
        """Make every reader start over (a restore replaced the whole store)."""
        with self._lock:
            self._first += len(self._ids) + self.capacity + 1
            self._ids = []

    def since(self, seq: int) -> tuple[int, list[str] | None]:
        """The current sequence number and the ids changed after ``seq``.

        None instead of the ids when they are no longer all kept (or ``seq``
        is from before a restore): the reader must refresh everything.
        """
        with self._lock:
            now = self._first + len(self._ids)
            if seq == now:
                return now, []
            if seq < self._first or seq > now:
                return now, None
            return now, self._ids[seq - self._first :]
