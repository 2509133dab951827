"""The contract between the exported dense network and whoever runs it.

The trainer exports its torch module to ONNX with exactly these input and
output names; the server builds the same feed from a :class:`BatchFeatures`
and the rows it pulled. Keeping the names and the feed builder here (in
``feature_store``, which both sides import) is what keeps training and
serving from drifting.

Inputs (B = rows in the batch, N_t = unique keys pulled from table t):

- ``emb__{table}``: float32 ``(N_t, dim_t)``, the temporary embedding matrix;
- ``idx__{column}``: int64 ``(B,)`` or ``(B, max_len)``, indices into it,
  padding = ``N_t`` (the model appends a zero row); a multi-valued column of
  the user (:func:`per_request`: the history, the recent views, an attention
  block's sequence) is ``(S, max_len)``, one row per distinct sequence (see
  ``seq_row``), so a request pools its user's lists once, not once per
  candidate;
- ``wide_weights``: float32 ``(N_w, 1)``; ``wide_idx``: int64 ``(B, W)``;
- ``dense``: float32 ``(B, n_dense)``;
- ``seq_row``: int64 ``(B,)``, only for a schema with such columns
  (:func:`has_sequences`): the row of the ``(S, max_len)`` inputs each batch
  row reads (training: ``0..B-1``; a recommend request: all 0, or 1 for the
  cold start's anonymous rows stacked under the user's, so a user's lists are
  pooled and projected once for every candidate).

Versions exported before the history was per sequence read ``idx__history``
as ``(B, max_len)`` (its first axis named ``B``, not ``S``) and, without an
attention block, had no ``seq_row``: :func:`build_feed` takes the inputs a
session has and their row axes, and feeds such a version the old shapes.

Outputs, float32 ``(B,)`` each, one per ranking head, in the order of
:data:`feature_store.heads.HEADS` and named by each head's ``output``: ``score``
(the primary, ``engagement`` head: it keeps the name a single-output model
gave its only output, so a version with heads still serves on a server that
predates them, and a server reads a single-output version as engagement
alone), ``watch``, ``negative``.

The served score fuses them (``app/scoring/fusion.py``).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from feature_store.features.columns import Categorical, MultiValued
from feature_store.features.extract import BatchFeatures
from feature_store.features.schema import FeatureSchema
from feature_store.features.sources import SOURCES
from feature_store.heads import HEAD_NAMES, PRIMARY
from feature_store.heads import HEADS as HEAD_SPECS

WIDE_WEIGHTS = "wide_weights"
WIDE_INDICES = "wide_idx"
DENSE = "dense"
SEQUENCE_ROWS = "seq_row"
SCORE = PRIMARY.output_name
"""The primary head's output: the one output every version has."""
SCORE_HEAD = PRIMARY.name
"""The primary head, whose output is :data:`SCORE`."""

HEADS: tuple[str, ...] = HEAD_NAMES
"""Ranking heads by name, in the order of the model's outputs (and of its last layer's
rows); their specs are :data:`feature_store.heads.HEADS`."""
HEAD_OUTPUTS = {h.name: h.output_name for h in HEAD_SPECS}
"""ONNX output name of each head."""
OUTPUT_NAMES = [h.output_name for h in HEAD_SPECS]
"""Every output of a model with heads, in order."""


def per_request(column: Categorical | MultiValued) -> bool:
    """Whether ``column``'s index input has one row per sequence (``S`` rows, see
    ``seq_row``) rather than one per batch row: a multi-valued column whose source
    reads nothing of the video (:attr:`~feature_store.features.sources.Source.per_request`),
    or one an attention block reads."""
    if not isinstance(column, MultiValued):
        return False
    return column.pooling == "attention" or SOURCES[column.source].per_request


def has_sequences(schema: FeatureSchema) -> bool:
    """Whether the model takes ``seq_row`` (it has a :func:`per_request` column)."""
    return any(per_request(c) for c in schema.embedded)


def embedding_input(table: str) -> str:
    return f"emb__{table}"


def index_input(column: str) -> str:
    return f"idx__{column}"


def input_names(schema: FeatureSchema) -> list[str]:
    """Every input of the exported model, in positional order."""
    names = [embedding_input(t) for t in schema.table_dims()]
    names += [index_input(c.name) for c in schema.embedded]
    names += [WIDE_WEIGHTS, WIDE_INDICES, DENSE]
    return [*names, SEQUENCE_ROWS] if has_sequences(schema) else names


def build_feed(
    schema: FeatureSchema,
    batch: BatchFeatures,
    table_rows: dict[str, npt.NDArray[np.float32]],
    wide_rows: npt.NDArray[np.float32],
    row_shaped: Collection[str] = (),
    sequence_rows: bool = True,
) -> dict[str, npt.NDArray[np.generic]]:
    """The ONNX feed for a batch, given the rows pulled for its keys.

    ``row_shaped``: index inputs the version takes one row per batch row although
    this schema has them per sequence, and ``sequence_rows`` False: it has no
    ``seq_row`` input (a version exported before the history was per sequence,
    see the module docstring): each such row gets its sequence's indices."""
    feed: dict[str, npt.NDArray[np.generic]] = {}
    for table in schema.table_dims():
        feed[embedding_input(table)] = np.ascontiguousarray(table_rows[table], dtype=np.float32)
    sequences = has_sequences(schema)
    for col in schema.embedded:
        name = index_input(col.name)
        indices = batch.column_indices[col.name]
        if name in row_shaped and len(indices) != batch.batch_size:
            indices = indices[batch.sequence_rows()]
        feed[name] = indices
    feed[WIDE_WEIGHTS] = np.ascontiguousarray(wide_rows, dtype=np.float32).reshape(-1, 1)
    feed[WIDE_INDICES] = batch.wide_indices
    feed[DENSE] = batch.dense
    if sequences and sequence_rows:
        feed[SEQUENCE_ROWS] = batch.sequence_rows()
    return feed
