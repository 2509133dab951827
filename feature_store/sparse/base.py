"""The sparse table: the trainer's parameter server for embeddings and wide weights.

A table maps 64-bit feature keys (see :mod:`feature_store.keys`) to rows of
``dim`` float32 weights. A training batch pulls only the keys it touches into
a small temporary matrix, trains on it, and pushes one gradient row per key;
the table applies its per-key optimizer. Serving pulls weights only.

Backends beside this file: ``memory`` (numpy, the embedded default,
snapshotted to disk), ``redis`` (binary float32 values, pipelined) and
``cluster`` (the same on Redis Cluster, rows in hash-tag buckets).

Semantics shared by every backend (the same tests run against each):

- **Keys** are ``uint64`` numpy arrays. ``push`` and a training ``pull``
  take *unique* keys (the caller deduplicates, e.g. with ``np.unique``); a
  serving ``pull(keys, train=False)`` may repeat a key and gets its row each
  time (serving groups keys per column without merging them). Any count
  works, there is no fixed batch capacity.
- **Missing rows**: ``pull(keys, train=False)`` (serving) returns zeros for a
  key without a row, so an unknown id contributes nothing. ``pull(keys,
  train=True)`` counts a sighting of each missing key; once a key has been
  sighted ``admission_threshold`` times it is *admitted* and pulls return its
  initial value (see :mod:`feature_store.sparse.initializers`); until then it
  pulls zeros and its gradients are dropped by ``push``.
- **Push** applies the table's optimizer (Adagrad or Adam for embeddings,
  FTRL for wide weights) row by row; a row's optimizer state is stored
  with its weights (Redis: in the same value) and ``pull`` returns the
  weights alone.
- **Expiry**: a row not updated for ``ttl_s`` seconds disappears with its
  state (Redis: key TTLs; memory: checked on read, swept by ``expire``).
- **Concurrency**: pushes of the same key by two writers at once resolve as
  *last writer wins* per batch (asynchronous SGD, as in Hogwild or a
  parameter server without locks): one writer's update to that key may be
  lost, but a row's weights and state always come whole from one writer and
  never mix bytes of two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Keys = npt.NDArray[np.uint64]
Rows = npt.NDArray[np.float32]

OptimizerName = Literal["adagrad", "adam", "ftrl"]


@dataclass(frozen=True)
class TableSpec:
    """What a table holds and how it learns."""

    name: str
    """Table name, unique within a model; part of every Redis key."""
    dim: int
    """Floats per row (embedding dimension; 1 for wide weights)."""
    optimizer: OptimizerName
    preset: Mapping[int, Rows] | None = field(default=None, compare=False, hash=False)
    """Initial rows of some keys (``features.text_vectors``); the rest start at random."""


@dataclass(frozen=True)
class TableStats:
    """Counts for the dashboard and metrics."""

    rows: int
    """Rows currently stored (admitted, not expired)."""
    admissions: int
    """Keys admitted since this table object was created."""
    expirations: int
    """Rows removed by expiry since this table object was created (memory only;
    Redis expires keys itself and reports 0)."""
    bytes: int
    """Approximate bytes used by weights and optimizer state."""


@runtime_checkable
class SparseTable(Protocol):
    """One table of rows keyed by uint64. See the module docstring for semantics."""

    spec: TableSpec

    def pull(self, keys: Keys, *, train: bool = False) -> Rows:
        """Weights of ``keys`` (unique), shape ``(len(keys), dim)``, float32."""
        ...

    def push(self, keys: Keys, grads: Rows) -> None:
        """Apply one gradient row per key (unique keys, ``grads`` shaped like a pull)."""
        ...

    def expire(self, now_s: float | None = None) -> int:
        """Drop rows past their TTL; returns how many went (Redis: 0, it expires itself)."""
        ...

    def stats(self) -> TableStats: ...

    def snapshot(self, directory: Path) -> None:
        """Write every row, its state and its update time under ``directory``.

        The format (see :mod:`feature_store.sparse.snapshot`) is shared by
        every backend, so a memory snapshot can seed Redis and vice versa.
        Written to a temporary directory and renamed, so a crash mid-way
        never leaves a half snapshot in place.
        """
        ...

    def restore(self, directory: Path) -> int:
        """Replace the table's contents with a snapshot; returns rows loaded."""
        ...

    def clear(self) -> None:
        """Remove every row, state and counter of this table."""
        ...

    def close(self) -> None: ...
