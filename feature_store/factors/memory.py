"""Factors in this process (embedded and the evaluation's replay): the trainer and the
service share the object, so a fold-in is read by the next request."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from feature_store.factors.base import ItemFactors, Vectors


class MemoryFactors:
    """See :mod:`feature_store.factors.base`. Not persisted: the trainer refits from the
    views its checkpoint keeps, at its first batch after a restart."""

    def __init__(self) -> None:
        self._items: ItemFactors | None = None
        self._users: dict[str, Vectors] = {}
        self._lock = threading.Lock()

    def publish(self, ids: Sequence[str], vectors: Vectors, users: Sequence[str],
                user_vectors: Vectors) -> int:
        with self._lock:
            version = 1 if self._items is None else self._items.version + 1
            rows = np.asarray(user_vectors, np.float32)
            self._users = {u: rows[i] for i, u in enumerate(users)}
            self._items = ItemFactors(version, tuple(ids), np.asarray(vectors, np.float32))
            return version

    def fold(self, version: int, users: Sequence[str], user_vectors: Vectors) -> None:
        with self._lock:
            if self._items is None or self._items.version != version:
                return
            rows = np.asarray(user_vectors, np.float32)
            for i, u in enumerate(users):
                self._users[u] = rows[i]

    def read(self, user_id: str) -> tuple[ItemFactors | None, Vectors | None]:
        with self._lock:
            return self._items, self._users.get(user_id)

    def ping(self) -> None:
        return None

    def clear(self) -> None:
        with self._lock:
            self._items, self._users = None, {}

    def close(self) -> None:
        return None
