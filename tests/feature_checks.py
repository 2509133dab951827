"""Comparing two :class:`BatchFeatures` by meaning rather than layout.

The trainer's extractor lists each table's keys sorted and unique; the
serving extractor lists them grouped by column (see
:mod:`app.scoring.features`). What the model computes depends only on which
key each row's index points at, so that is what these helpers compare.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from feature_store.features.extract import BatchFeatures
from feature_store.features.schema import FeatureSchema

PADDING = np.uint64(0)
"""Stands for "no key" (a padded slot); hashed keys are never 0."""


def resolved(batch: BatchFeatures, schema: FeatureSchema) -> dict[str, npt.NDArray[np.uint64]]:
    """Per embedded column, and ``"wide"``, the key each row's index points at."""
    out = {}
    for col in schema.embedded:
        keys = batch.table_keys[col.table_name()]
        indices = batch.column_indices[col.name]
        if len(indices) != batch.batch_size:  # a sequence: one row per distinct user
            indices = indices[batch.sequence_rows()]
        assert indices.min(initial=0) >= 0 and indices.max(initial=0) <= len(keys)
        out[col.name] = np.append(keys, PADDING)[indices]  # index len(keys) is the padding
    out["wide"] = batch.wide_keys[batch.wide_indices]
    return out


def assert_same_features(got: BatchFeatures, want: BatchFeatures, schema: FeatureSchema) -> None:
    """``got`` feeds the model exactly what ``want`` does."""
    assert got.batch_size == want.batch_size
    got_keys, want_keys = resolved(got, schema), resolved(want, schema)
    assert got_keys.keys() == want_keys.keys()
    for name, keys in want_keys.items():
        np.testing.assert_array_equal(got_keys[name], keys, err_msg=name)
    np.testing.assert_allclose(got.dense, want.dense, rtol=1e-6)
