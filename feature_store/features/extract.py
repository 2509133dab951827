"""From a batch of :class:`FeatureRow` to the model's inputs (the trainer's extractor).

Each column's declared source (:mod:`feature_store.features.sources`) is
evaluated on every row; the values are packed per row
(:class:`~feature_store.features.values.FeatureValues`, what the trainer keeps
of a shown video until its label is known) and deduplicated into
:class:`~feature_store.features.batch.BatchFeatures` (what the model consumes).
The service computes the same values faster for one user and many videos
(``app/scoring/features.py``); tests check the two agree for every declared
source.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import numpy.typing as npt

from feature_store.features.batch import BatchFeatures, Indices
from feature_store.features.columns import Categorical, FeatureRow
from feature_store.features.dense import dense_matrix, inputs_from_rows, reads_affinity
from feature_store.features.keys import KeyHasher, Keys
from feature_store.features.schema import FeatureSchema
from feature_store.features.sources import SOURCES, dense_fields
from feature_store.features.values import FeatureValues, layout_of

__all__ = ["BatchFeatures", "FeatureExtractor", "Indices"]


class FeatureExtractor:
    """Turns rows into :class:`FeatureValues` and :class:`BatchFeatures` for one schema.

    Holds one :class:`KeyHasher` per key space, so hashing cost amortises over
    a stream. Not thread-safe: give each worker thread its own extractor.
    """

    def __init__(self, schema: FeatureSchema) -> None:
        self.schema = schema
        self.layout = layout_of(schema)
        self._hashers: dict[str, KeyHasher] = {}
        self._dense_fields = dense_fields(schema)
        self._affinity = reads_affinity(schema.dense)

    def _hasher(self, space: str) -> KeyHasher:
        hasher = self._hashers.get(space)
        if hasher is None:
            hasher = self._hashers[space] = KeyHasher(space)
        return hasher

    def keys(self, col: Categorical, rows: list[FeatureRow]) -> Keys:
        """The keys of categorical column ``col`` for ``rows``."""
        compute = SOURCES[col.source].compute
        return self._hasher(col.space()).hash_many([compute(r) for r in rows])

    def values(self, rows: list[FeatureRow]) -> FeatureValues:
        """Every column's values for each row, packed (see :mod:`feature_store.features.values`)."""
        batch = len(rows)
        schema = self.schema
        categorical = np.empty((batch, len(schema.categorical)), dtype=np.uint64)
        for j, col in enumerate(schema.categorical):
            categorical[:, j] = self.keys(col, rows)
        multi: dict[str, tuple[Keys, npt.NDArray[np.int64]]] = {}
        for multi_col in schema.multi_valued:
            compute = SOURCES[multi_col.source].compute
            lists = [compute(r)[: multi_col.max_len] for r in rows]
            lengths = np.fromiter(map(len, lists), np.int64, batch)
            flat = list(chain.from_iterable(lists))
            multi[multi_col.name] = (self._hasher(multi_col.space()).hash_many(flat), lengths)
        inputs = inputs_from_rows(rows, self._dense_fields, self._affinity)
        dense = dense_matrix(schema.dense, inputs)
        return FeatureValues.pack(self.layout, categorical, multi, dense)

    def extract(self, rows: list[FeatureRow], wide: bool = True) -> BatchFeatures:
        """The model's inputs for ``rows`` (``wide`` False: without the wide part, see
        :meth:`FeatureValues.to_batch`)."""
        return self.values(rows).to_batch(wide)
