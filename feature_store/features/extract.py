"""From a batch of :class:`FeatureRow` to keys and index tensors.

The output is what a temporary-embedding-matrix model consumes (trainer and
ONNX server alike):

- per embedding table, the batch's *unique* keys, to pull once;
- per embedded column, int64 indices into that table's pulled rows: shape
  ``(B,)`` for a categorical column, ``(B, max_len)`` for a multi-valued one,
  padded with ``len(table_keys[table])`` (one past the last row: the model
  appends a zero row there, so padding pools to nothing);
- the wide part's unique keys and a ``(B, wide_width)`` index matrix;
- a ``(B, n_dense)`` float32 matrix of dense features.

No fixed capacity anywhere: sizes follow the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import numpy.typing as npt

from feature_store.features.columns import (
    CATEGORICAL_SOURCES,
    MULTI_SOURCES,
    FeatureRow,
    MultiValued,
)
from feature_store.features.dense import dense_matrix, inputs_from_rows
from feature_store.features.keys import KeyHasher, Keys, cross_keys
from feature_store.features.schema import FeatureSchema

Indices = npt.NDArray[np.int64]


@dataclass
class BatchFeatures:
    """Keys to pull and tensors to feed, for one batch of rows."""

    batch_size: int
    table_keys: dict[str, Keys]
    """Unique keys per embedding table, in the order the rows must be pulled."""
    column_indices: dict[str, Indices]
    """Per embedded column: indices into its table's pulled rows (see module doc)."""
    wide_keys: Keys
    wide_indices: Indices
    """``(B, wide_width)`` indices into ``wide_keys``."""
    dense: npt.NDArray[np.float32]
    unique_key_count: int = field(init=False)

    def __post_init__(self) -> None:
        self.unique_key_count = int(
            sum(len(k) for k in self.table_keys.values()) + len(self.wide_keys)
        )


class FeatureExtractor:
    """Turns rows into :class:`BatchFeatures` for one :class:`FeatureSchema`.

    Holds one :class:`KeyHasher` per key space, so hashing cost amortises over
    a stream. Thread-safe enough for one user at a time per instance; give
    each worker thread its own extractor.
    """

    def __init__(self, schema: FeatureSchema) -> None:
        self.schema = schema
        self._hashers: dict[str, KeyHasher] = {}
        self._wide_hashers: dict[str, KeyHasher] = {}

    def _hasher(self, space: str) -> KeyHasher:
        hasher = self._hashers.get(space)
        if hasher is None:
            hasher = self._hashers[space] = KeyHasher(space)
        return hasher

    def extract(self, rows: list[FeatureRow]) -> BatchFeatures:
        batch = len(rows)
        raw: dict[str, Keys] = {}  # column -> keys in row order (flattened for multi)
        lengths: dict[str, npt.NDArray[np.int64]] = {}
        for col in self.schema.categorical:
            source = CATEGORICAL_SOURCES[col.source]
            raw[col.name] = self._hasher(col.space()).hash_many([source(r) for r in rows])
        for multi in self.schema.multi_valued:
            multi_source = MULTI_SOURCES[multi.source]
            lists = [multi_source(r)[: multi.max_len] for r in rows]
            lengths[multi.name] = np.fromiter(map(len, lists), np.int64, batch)
            flat = list(chain.from_iterable(lists))
            raw[multi.name] = self._hasher(multi.space()).hash_many(flat)

        table_keys, column_indices = self._index_tables(batch, raw, lengths)
        wide_keys, wide_indices = self._index_wide(batch, raw)
        dense = dense_matrix(self.schema.dense, inputs_from_rows(rows))
        return BatchFeatures(batch, table_keys, column_indices, wide_keys, wide_indices, dense)

    def _index_tables(
        self,
        batch: int,
        raw: dict[str, Keys],
        lengths: dict[str, npt.NDArray[np.int64]],
    ) -> tuple[dict[str, Keys], dict[str, Indices]]:
        by_table: dict[str, list[str]] = {}
        for col in self.schema.embedded:
            by_table.setdefault(col.table_name(), []).append(col.name)
        columns = {c.name: c for c in self.schema.embedded}
        table_keys: dict[str, Keys] = {}
        column_indices: dict[str, Indices] = {}
        for table, names in by_table.items():
            parts = [raw[n] for n in names]
            unique, inverse = np.unique(np.concatenate(parts), return_inverse=True)
            table_keys[table] = unique
            pad = len(unique)
            start = 0
            for name, part in zip(names, parts, strict=True):
                idx = inverse[start : start + len(part)].astype(np.int64)
                start += len(part)
                col = columns[name]
                if isinstance(col, MultiValued):
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    padded[np.arange(col.max_len) < lengths[name][:, None]] = idx
                    column_indices[name] = padded
                else:
                    column_indices[name] = idx
        return table_keys, column_indices

    def _index_wide(self, batch: int, raw: dict[str, Keys]) -> tuple[Keys, Indices]:
        wide_parts = [raw[c.name] for c in self.schema.categorical if c.wide]
        wide_parts += [
            cross_keys(c.name, [raw[name] for name in c.columns]) for c in self.schema.crossed
        ]
        if not wide_parts:
            return np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
        stacked = np.stack(wide_parts, axis=1)  # (B, W)
        unique, inverse = np.unique(stacked.ravel(), return_inverse=True)
        return unique, inverse.reshape(batch, len(wide_parts)).astype(np.int64)
