"""The model's inputs for one batch: unique keys per table, index tensors, dense values.

What a temporary-embedding-matrix model consumes (trainer and ONNX server alike):

- per embedding table, the batch's *unique* keys, to pull once;
- per embedded column, int64 indices into that table's pulled rows: shape
  ``(B,)`` for a categorical column, ``(B, max_len)`` for a multi-valued one,
  padded with ``len(table_keys[table])`` (one past the last row: the model
  appends a zero row there, so padding pools to nothing);
- the wide part's unique keys and a ``(B, wide_width)`` index matrix;
- a ``(B, n_dense)`` float32 matrix of dense features;
- for the user's multi-valued columns (the history, the recent views, the
  sequences an attention block reads: :func:`feature_store.models.model_io.per_request`),
  indices ``(S, max_len)`` with one row per distinct user, and per batch row
  the sequence row it reads (:attr:`BatchFeatures.sequence_row`). Training
  batches have ``S == B``; a request has ``S == 1`` (2 with the cold start's
  anonymous rows stacked under the user's).

No fixed capacity anywhere: sizes follow the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from feature_store.features.keys import Keys

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
    sequence_row: Indices | None = None
    """``(B,)`` the row of the sequence columns' ``(S, max_len)`` indices each row reads;
    None: row ``i`` reads row ``i`` (``S == B``). A request sets all 0 (``S == 1``)."""
    unique_key_count: int = field(init=False)

    def __post_init__(self) -> None:
        self.unique_key_count = int(
            sum(len(k) for k in self.table_keys.values()) + len(self.wide_keys)
        )

    def first_rows(self, n: int) -> BatchFeatures:
        """The batch of its first ``n`` rows (views, no copy; the keys stay whole). A
        sequence column keeps its rows: the first rows read sequence 0 and later
        ones (the cold start's reference user, say) may read others."""
        if n == self.batch_size:
            return self
        total = self.batch_size
        return BatchFeatures(
            n,
            self.table_keys,
            {k: v[:n] if len(v) == total else v for k, v in self.column_indices.items()},
            self.wide_keys,
            self.wide_indices[:n],
            self.dense[:n],
            None if self.sequence_row is None else self.sequence_row[:n],
        )

    def sequence_rows(self) -> Indices:
        """:attr:`sequence_row`, or ``0..B-1`` when every row has its own sequence."""
        if self.sequence_row is not None:
            return self.sequence_row
        return np.arange(self.batch_size, dtype=np.int64)
