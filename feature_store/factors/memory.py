"""Factors in this process (embedded and the evaluation's replay): the trainer and the
service share the object, so a fold-in is read by the next request.

Snapshotted with the other in-process stores (``data_dir/factors``, by
:class:`~feature_store.runtime.resources.Resources`): a restarted service ranks
with the last fit before its trainer has fitted again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from feature_store.atomic import atomic_binary
from feature_store.factors.base import ItemFactors, Vectors

SNAPSHOT_FILE = "factors.npz"


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

    def snapshot(self, directory: Path) -> None:
        """The newest fit and its users' factors, atomically (nothing when there is none)."""
        with self._lock:
            items, users = self._items, dict(self._users)
        if items is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        dim = items.dim
        rows = np.stack(list(users.values())) if users else np.zeros((0, dim), np.float32)
        with atomic_binary(directory / SNAPSHOT_FILE) as out:
            np.savez(out, version=np.int64(items.version), ids=np.array(items.ids, dtype=str),
                     vectors=items.vectors, users=np.array(list(users), dtype=str),
                     user_vectors=rows)

    def restore(self, directory: Path) -> None:
        """Load what :meth:`snapshot` wrote (no pickles: ids are fixed-width text)."""
        path = directory / SNAPSHOT_FILE
        if not path.is_file():
            return
        with np.load(path, allow_pickle=False) as saved:
            items = ItemFactors(int(saved["version"]), tuple(saved["ids"].tolist()),
                                saved["vectors"].astype(np.float32))
            rows = saved["user_vectors"].astype(np.float32)
            users = {u: rows[i] for i, u in enumerate(saved["users"].tolist())}
        with self._lock:
            self._items, self._users = items, users

    def ping(self) -> None:
        return None

    def clear(self) -> None:
        with self._lock:
            self._items, self._users = None, {}

    def close(self) -> None:
        return None
