"""Feature values of rows, packed: what a row was featurised as, kept for later.

A row's *values* are the keys of its categorical and multi-valued columns and
its dense numbers: everything the model's inputs are built from, before a
batch deduplicates keys into tables (:class:`~feature_store.features.extract.BatchFeatures`).
They are packed as one row of uint64 slots per sample::

    [categorical keys][each multi column's keys, 0-padded][multi lengths][dense as float32 bits]

so ``B`` rows are one ``(B, W)`` array: sliced, stacked, saved and sent with
no per-row objects (155 slots, 1,240 bytes, for the default schema).

They exist because featurising and training happen at different moments:

- the trainer featurises a video when it is *shown* (its impression) and
  trains the engagement that follows, or the impression's timeout negative,
  on those values later (:mod:`trainer.labels`): a sample never sees what
  happened after it was shown;
- the service logs the values it scored for the items it served (the served
  log, :mod:`feature_store.served`), and the trainer trains on them.

:meth:`FeatureValues.to_batch` turns rows into the model's inputs; crosses are
computed there, from the categorical keys, with the one
:func:`~feature_store.features.keys.cross_keys`. :meth:`FeatureValues.from_batch`
goes the other way for a request's batch. Keys are never 0 (the hasher maps
0 to 1), so 0 marks padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from feature_store.features.batch import BatchFeatures, Indices
from feature_store.features.columns import MultiValued
from feature_store.features.keys import Keys, cross_keys
from feature_store.features.schema import FeatureSchema
from feature_store.features.sources import SOURCES

Packed = npt.NDArray[np.uint64]

_PAD = np.zeros(1, dtype=np.uint64)
"""The key a multi-valued column's padding index reads (keys are never 0)."""


@dataclass(frozen=True)
class Packing:
    """Which columns of a batch fill which slots of a row of ``width`` slots: the whole
    layout, or one of its parts (the served log packs the request part of one row and the
    item part of each served row, :func:`split_from_batch`). Built once per layout, so a
    request does not rebuild the schema's column lists."""

    width: int
    categorical_at: tuple[tuple[int, str, str], ...]
    """Per categorical column: its slot, table and name."""
    multi_at: tuple[tuple[slice, int, str, str], ...]
    """Per multi-valued column: its slots, its length slot, table and name."""
    dense: slice | None
    """The dense values' slots (None: not in this part)."""


@dataclass(frozen=True)
class ValueLayout:
    """Where each column's values sit in a packed row (see the module docstring)."""

    schema: FeatureSchema
    width: int
    categorical: slice
    multi: dict[str, slice]
    lengths: dict[str, int]
    dense: slice
    request_slots: npt.NDArray[np.int64]
    """Slots of columns whose source reads no video: equal on every item of one request."""
    item_slots: npt.NDArray[np.int64] = field(repr=False)
    """The other slots (video columns, their lengths, every dense value)."""
    whole: Packing = field(repr=False)
    """How :meth:`FeatureValues.from_batch` packs a whole row."""
    request_part: Packing = field(repr=False)
    """How the ``request_slots`` alone are packed (in their order)."""
    item_part: Packing = field(repr=False)
    """How the ``item_slots`` alone are packed (in their order)."""


@lru_cache(maxsize=16)
def layout_of(schema: FeatureSchema) -> ValueLayout:
    """The packed layout of ``schema``'s rows (one per schema, cached)."""
    n_cat = len(schema.categorical)
    at = n_cat
    multi: dict[str, slice] = {}
    for col in schema.multi_valued:
        multi[col.name] = slice(at, at + col.max_len)
        at += col.max_len
    lengths: dict[str, int] = {}
    for col in schema.multi_valued:
        lengths[col.name] = at
        at += 1
    dense = slice(at, at + len(schema.dense))
    width = dense.stop
    request = [j for j, c in enumerate(schema.categorical) if SOURCES[c.source].per_request]
    for col in schema.multi_valued:
        if SOURCES[col.source].per_request:
            request += [*range(multi[col.name].start, multi[col.name].stop), lengths[col.name]]
    request_slots = np.array(sorted(request), dtype=np.int64)
    item_slots = np.setdiff1d(np.arange(width, dtype=np.int64), request_slots)
    whole = Packing(
        width,
        tuple((j, c.table_name(), c.name) for j, c in enumerate(schema.categorical)),
        tuple((multi[c.name], lengths[c.name], c.table_name(), c.name)
              for c in schema.multi_valued),
        dense,
    )
    return ValueLayout(
        schema, width, slice(0, n_cat), multi, lengths, dense, request_slots, item_slots,
        whole, _part(whole, request_slots), _part(whole, item_slots),
    )


def _part(whole: Packing, slots: npt.NDArray[np.int64]) -> Packing:
    """The packing of ``slots`` (sorted) alone: the columns whose slots are there, at their
    positions among ``slots``. A column's slots are all in one part or all in the other
    (the parts split by the column's source)."""
    at = {s: i for i, s in enumerate(slots.tolist())}

    def moved(part: slice) -> slice:
        start = at[part.start] if part.stop > part.start else 0
        return slice(start, start + part.stop - part.start)

    dense = whole.dense
    return Packing(
        len(slots),
        tuple((at[j], table, name) for j, table, name in whole.categorical_at if j in at),
        tuple((moved(multi), at[length], table, name)
              for multi, length, table, name in whole.multi_at if length in at),
        moved(dense) if dense is not None and dense.start in at else None,
    )


class FeatureValues:
    """``B`` rows of packed feature values of one schema."""

    __slots__ = ("layout", "packed")

    def __init__(self, layout: ValueLayout, packed: Packed) -> None:
        if packed.ndim != 2 or packed.shape[1] != layout.width or packed.dtype != np.uint64:
            raise ValueError(
                f"packed values must be uint64 of shape (B, {layout.width}), "
                f"not {packed.dtype} {packed.shape}"
            )
        self.layout = layout
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed)

    @classmethod
    def empty(cls, layout: ValueLayout, rows: int = 0) -> FeatureValues:
        return cls(layout, np.zeros((rows, layout.width), dtype=np.uint64))

    @classmethod
    def stack(cls, layout: ValueLayout, rows: Sequence[Packed]) -> FeatureValues:
        """Rows (each ``(W,)``) stacked in order."""
        if not rows:
            return cls.empty(layout)
        return cls(layout, np.stack(rows))

    def take(self, index: Indices | Sequence[int]) -> FeatureValues:
        return FeatureValues(self.layout, self.packed[np.asarray(index, dtype=np.int64)])

    # --- reading columns --------------------------------------------------

    @property
    def categorical(self) -> Keys:
        """(B, C) keys of the categorical columns, in schema order (a view)."""
        return self.packed[:, self.layout.categorical]

    def multi(self, name: str) -> tuple[Keys, npt.NDArray[np.int64]]:
        """(B, max_len) keys of multi-valued column ``name`` (0-padded) and (B,) lengths."""
        lengths = self.packed[:, self.layout.lengths[name]].astype(np.int64)
        return self.packed[:, self.layout.multi[name]], lengths

    @property
    def dense(self) -> npt.NDArray[np.float32]:
        """(B, D) dense values (a copy, C-contiguous)."""
        return self.packed[:, self.layout.dense].astype(np.uint32).view(np.float32)

    # --- packing ----------------------------------------------------------

    @classmethod
    def pack(
        cls,
        layout: ValueLayout,
        categorical: Keys,
        multi: Mapping[str, tuple[Sequence[int] | Keys, npt.NDArray[np.int64]]],
        dense: npt.NDArray[np.float32],
    ) -> FeatureValues:
        """Rows from (B, C) categorical keys, per multi column its valid keys flattened in
        row order with (B,) lengths, and (B, D) dense values."""
        batch = len(dense)
        out = np.zeros((batch, layout.width), dtype=np.uint64)
        out[:, layout.categorical] = categorical
        for name, (flat, lengths) in multi.items():
            part = layout.multi[name]
            block = out[:, part]
            block[np.arange(part.stop - part.start) < lengths[:, None]] = flat
            out[:, layout.lengths[name]] = lengths
        out[:, layout.dense] = np.ascontiguousarray(dense, dtype=np.float32).view(np.uint32)
        return cls(layout, out)

    @classmethod
    def from_batch(
        cls, layout: ValueLayout, batch: BatchFeatures, rows: Indices
    ) -> FeatureValues:
        """The values behind rows ``rows`` of a deduplicated batch (a request's, say)."""
        return cls(layout, pack_rows(layout.whole, batch, rows))

    # --- to the model's inputs --------------------------------------------

    def to_batch(self, wide: bool = True) -> BatchFeatures:
        """Keys deduplicated per table, index tensors and dense values for the model.
        ``wide`` False: no wide part (no keys, ``(B, 0)`` indices), for a reader of the
        embedding tables only (the towers' user vector, once a request)."""
        schema = self.layout.schema
        batch = len(self)
        raw: dict[str, Keys] = {}
        lengths: dict[str, npt.NDArray[np.int64]] = {}
        categorical = self.categorical
        for j, col in enumerate(schema.categorical):
            raw[col.name] = categorical[:, j]
        for multi in schema.multi_valued:
            keys, count = self.multi(multi.name)
            raw[multi.name] = keys[np.arange(multi.max_len) < count[:, None]]
            lengths[multi.name] = count
        table_keys, column_indices = index_tables(schema, batch, raw, lengths)
        if wide:
            wide_keys, wide_indices = index_wide(schema, batch, raw)
        else:
            wide_keys, wide_indices = np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
        return BatchFeatures(
            batch, table_keys, column_indices, wide_keys, wide_indices, self.dense
        )


def index_tables(
    schema: FeatureSchema,
    batch: int,
    raw: dict[str, Keys],
    lengths: dict[str, npt.NDArray[np.int64]],
) -> tuple[dict[str, Keys], dict[str, Indices]]:
    """Per table its sorted unique keys, per embedded column its indices into them.

    ``raw`` holds each column's keys in row order (multi-valued columns: the
    valid keys flattened, with ``lengths`` per row).
    """
    by_table: dict[str, list[str]] = {}
    for col in schema.embedded:
        by_table.setdefault(col.table_name(), []).append(col.name)
    columns = {c.name: c for c in schema.embedded}
    table_keys: dict[str, Keys] = {}
    column_indices: dict[str, Indices] = {}
    for table, names in by_table.items():
        parts = [raw[n] for n in names]
        keys = np.concatenate(parts)
        if len(keys) <= 1:  # one row's user or context column: np.unique would cost 10 us
            unique, inverse = keys, np.zeros(len(keys), dtype=np.intp)
        else:
            unique, inverse = np.unique(keys, return_inverse=True)
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


def index_wide(schema: FeatureSchema, batch: int, raw: dict[str, Keys]) -> tuple[Keys, Indices]:
    """The wide part's unique keys (wide categorical columns, then crosses) and
    ``(B, wide_width)`` indices into them."""
    wide_parts = [raw[c.name] for c in schema.categorical if c.wide]
    wide_parts += [
        cross_keys(c.name, [raw[name] for name in c.columns]) for c in schema.crossed
    ]
    if not wide_parts:
        return np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
    stacked = np.stack(wide_parts, axis=1)  # (B, W)
    unique, inverse = np.unique(stacked.ravel(), return_inverse=True)
    return unique, inverse.reshape(batch, len(wide_parts)).astype(np.int64)


def pack_rows(packing: Packing, batch: BatchFeatures, rows: Indices) -> Packed:
    """``(len(rows), packing.width)`` values of ``rows`` of ``batch`` (see :class:`Packing`)."""
    out = np.zeros((len(rows), packing.width), dtype=np.uint64)
    table_keys, indices = batch.table_keys, batch.column_indices
    for j, table, name in packing.categorical_at:
        out[:, j] = table_keys[table][indices[name][rows]]
    if packing.multi_at:
        sequence = batch.sequence_rows()[rows]
        padded: dict[str, Keys] = {}  # per table, its keys and a 0 where padding points
        for slots, length, table, name in packing.multi_at:
            keys = padded.get(table)
            if keys is None:
                keys = padded[table] = np.concatenate((table_keys[table], _PAD))
            column = indices[name]
            # A sequence column has one row per sequence: each row reads its own.
            at = column[rows] if len(column) == batch.batch_size else column[sequence]
            out[:, slots] = keys[at]
            out[:, length] = (at < len(keys) - 1).sum(axis=1)
    if packing.dense is not None:
        out[:, packing.dense] = np.ascontiguousarray(batch.dense[rows]).view(np.uint32)
    return out


def split_from_batch(
    layout: ValueLayout, batch: BatchFeatures, rows: Indices
) -> tuple[Packed, Packed]:
    """``(R,)`` the request slots (every row of a request shares them: read from the first
    of ``rows``) and ``(len(rows), I)`` the item slots of ``rows``: what
    ``from_batch(...).packed`` gives at ``[0, request_slots]`` and ``[:, item_slots]``,
    without packing the request's columns (the history's dozens of slots) once per row."""
    if not len(rows):
        return (np.zeros(layout.request_part.width, np.uint64),
                np.zeros((0, layout.item_part.width), np.uint64))
    request = pack_rows(layout.request_part, batch, rows[:1])[0]
    return request, pack_rows(layout.item_part, batch, rows)
