"""The two-tower contract shared by the trainer and the service.

The towers read the ranker's feature columns (the same keys, from the same
extractors) but their own sparse tables: a column whose ranker table is
``video`` reads ``tt_video`` (so the ``history`` column, which shares the
ranker's ``video`` table, shares ``tt_video`` too: a watched video and a
candidate are the same row here as well). Every tower table has one width,
``retrieval.table_dim``.

A version with towers carries, beside ``model.onnx``:

- ``user_tower.onnx``: input ``pooled`` ``(B, width)`` (the user columns'
  pooled rows, concatenated in :attr:`Towers.user` order), output ``vector``
  ``(B, dim)``, L2-normalised;
- ``video_vectors.npy`` ``(N, dim)`` float32 and ``video_ids.txt`` (N lines):
  every catalog video's vector at export.

Pooling (sum of a column's rows, mean for a ``mean`` multi-valued column) is
:func:`pool` here, in numpy, so the service and the trainer's export pool
the same way; the tests check it against the trainer's torch pooling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from feature_store.errors import ConfigurationError
from feature_store.features.batch import BatchFeatures
from feature_store.features.columns import Categorical, MultiValued
from feature_store.features.schema import FeatureSchema
from feature_store.settings import RetrievalSettings

TABLE_PREFIX = "tt_"
"""Prefix of the towers' sparse tables (no ranker table starts with it)."""
USER_TOWER_FILE = "user_tower.onnx"
VIDEO_VECTORS_FILE = "video_vectors.npy"
VIDEO_IDS_FILE = "video_ids.txt"
ARTIFACTS = (USER_TOWER_FILE, VIDEO_VECTORS_FILE, VIDEO_IDS_FILE)
"""The files a version with towers carries (listed in its manifest)."""
POOLED = "pooled"
"""The user tower's ONNX input."""
VECTOR = "vector"
"""The user tower's ONNX output."""
MANIFEST_KEY = "retrieval"
"""Key of :meth:`Towers.describe` in a manifest's ``extra``."""

EmbeddedColumn = Categorical | MultiValued


def tower_table(table: str) -> str:
    """The tower table that stands for the ranker's ``table``."""
    return TABLE_PREFIX + table


@dataclass(frozen=True)
class Towers:
    """Which columns each tower pools, and the widths (see the module docstring)."""

    user: tuple[EmbeddedColumn, ...]
    video: tuple[EmbeddedColumn, ...]
    table_dim: int
    dim: int

    @classmethod
    def from_settings(cls, schema: FeatureSchema, settings: RetrievalSettings) -> Towers:
        """The towers over ``schema``'s columns named in ``settings``; a name the schema
        does not embed is a :class:`ConfigurationError` naming the setting."""
        embedded = {c.name: c for c in schema.embedded}

        def pick(field: str, names: Sequence[str]) -> tuple[EmbeddedColumn, ...]:
            if not names:
                raise ConfigurationError(f"retrieval.{field}: needs at least one column")
            unknown = [n for n in names if n not in embedded]
            if unknown:
                raise ConfigurationError(
                    f"retrieval.{field}: {unknown} are not embedded columns of the schema "
                    f"({sorted(embedded)})"
                )
            return tuple(embedded[n] for n in names)

        return cls(
            user=pick("user_columns", settings.user_columns),
            video=pick("video_columns", settings.video_columns),
            table_dim=settings.table_dim,
            dim=settings.dim,
        )

    @property
    def source_tables(self) -> list[str]:
        """The ranker tables whose keys the towers read, first-use order."""
        return list(dict.fromkeys(c.table_name() for c in (*self.user, *self.video)))

    @property
    def tables(self) -> dict[str, int]:
        """The tower tables and their width."""
        return {tower_table(t): self.table_dim for t in self.source_tables}

    def width(self, columns: Sequence[EmbeddedColumn]) -> int:
        """Floats of the pooled input of a tower over ``columns``."""
        return len(columns) * self.table_dim

    def describe(self) -> dict[str, Any]:
        """What a manifest records (the service refuses towers that differ from its own)."""
        return {
            "user_columns": [c.name for c in self.user],
            "video_columns": [c.name for c in self.video],
            "table_dim": self.table_dim,
            "dim": self.dim,
        }


def pool(
    columns: Sequence[EmbeddedColumn],
    batch: BatchFeatures,
    rows: Mapping[str, npt.NDArray[np.float32]],
) -> npt.NDArray[np.float32]:
    """``(B, len(columns) * table_dim)``: each column's rows pooled, concatenated.

    ``rows`` maps each *ranker* table name to the pulled tower rows of
    ``batch.table_keys[table]``; padding indices (one past the last row) pool
    to nothing, as in the ranker.
    """
    parts: list[npt.NDArray[np.float32]] = []
    for col in columns:
        table = rows[col.table_name()]
        padded = np.concatenate([table, np.zeros((1, table.shape[1]), np.float32)])
        idx = batch.column_indices[col.name]
        picked = padded[idx]
        if isinstance(col, MultiValued):
            pooled = picked.sum(axis=1)
            if col.pooling == "mean":
                count = (idx < len(table)).sum(axis=1, keepdims=True)
                pooled = pooled / np.maximum(count, 1).astype(np.float32)
            picked = pooled
        parts.append(picked.astype(np.float32, copy=False))
    return np.concatenate(parts, axis=1)
