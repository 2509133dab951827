"""Request-shaped feature extraction: one user, many candidate videos.

:class:`~feature_store.features.FeatureExtractor` evaluates every column on
every row in Python, about 9 ms for 500 candidates: more than the whole
latency budget. A recommendation request has structure it can exploit:

- user and context columns (user, device, country, surface, hour, history...)
  are the same for every candidate, so they are computed once and broadcast;
- video columns (video, creator, category, duration, tags) depend only on the
  catalog record, so their hashed keys are kept per video, in the rows of a
  :class:`~app.scoring.video_table.VideoTable`;
- dense columns are computed with numpy over arrays of the candidates' fields;
  those that depend only on the catalog record and the counters (duration,
  engagement rates...) are kept in the same rows and recomputed when the
  counters change, so a request computes only the clock- and user-dependent
  ones (age, recency, history);
- keys are deduplicated without sorting: each distinct value of a video
  column (creator, category, tags...) gets a small integer *code* when its
  video is first cached, so a request's distinct creators are a marker array
  over codes (O(candidates)) instead of an ``argsort`` of 64-bit keys; a
  cross of a user/context column with one video column is mixed only for
  that column's distinct keys, and shares its indices. Video ids are not
  deduplicated at all (candidates are distinct; a history video that is
  also a candidate is pulled twice, the same row).

Which column is computed where comes from its source's declaration
(:mod:`feature_store.features.sources`: ``per_request``, ``per_video``), not
from lists kept here; the schema refuses, at start, a source that is neither
(see the declarations' rules), so there is no slow per-row path to fall into.

The result means what the generic extractor's
:class:`~feature_store.features.BatchFeatures` for the equivalent
:class:`FeatureRow` list means: for every column and row, the key its index
points at is the same key (tests check this for every declared source and
random schemas), so training and serving cannot drift. Only the order of a
table's keys differs (the trainer's are sorted and unique; these are grouped
by column), which the model never sees: it gathers rows by index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.scoring.video_table import VideoTable
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features.batch import BatchFeatures, Indices
from feature_store.features.columns import Categorical, Crossed, FeatureRow, MultiValued
from feature_store.features.dense import DenseInputs, dense_matrix, reads_affinity
from feature_store.features.extract import FeatureExtractor
from feature_store.features.keys import Keys, cross_keys
from feature_store.features.schema import FeatureSchema
from feature_store.features.sources import SOURCES, dense_fields, video_fields
from feature_store.models import model_io

_CONSTANT_KEYS_MAX = 100_000


def unique_inverse(parts: Sequence[Keys]) -> tuple[Keys, list[npt.NDArray[np.int64]]]:
    """Sorted distinct keys of ``parts`` and, per part, each key's position in them.

    What ``np.unique(np.concatenate(parts), return_inverse=True)`` gives, split
    back per part, at a fraction of the cost for the few thousand keys of one
    request: numpy 2's ``np.unique`` hashes before it sorts, and a
    ``searchsorted`` per column costs more than one ``argsort`` of them all.
    """
    if len(parts) == 1 and len(parts[0]) == 1:  # a user or context table: one key
        return parts[0], [np.zeros(1, np.int64)]
    keys = np.concatenate(parts)
    if not len(keys):
        return keys, [np.zeros(len(p), np.int64) for p in parts]
    order = np.argsort(keys)
    ordered = keys[order]
    distinct = np.empty(len(ordered), dtype=bool)
    distinct[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=distinct[1:])
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = np.cumsum(distinct) - 1
    bounds = np.cumsum([len(p) for p in parts[:-1]]).tolist()
    return ordered[distinct], np.split(inverse, bounds)


def _distinct_users(keys: list[Keys]) -> Keys:
    """A user/context column's block: the users' one key each, once when they agree."""
    if len(keys) == 1 or keys[0][0] == keys[1][0]:
        return keys[0]
    return np.concatenate(keys)


class _Rows:
    """The rows of a request's batch: ``batch`` rows of the user, one per candidate, then
    (with ``reference_at``) the reference user's rows of the candidates at those
    positions. Maps what is computed once per candidate onto every row."""

    def __init__(self, batch: int, reference_at: Indices | None) -> None:
        self.batch = batch
        self.reference_at = reference_at
        extra = 0 if reference_at is None else len(reference_at)
        self.total = batch + extra
        self.users = 1 if reference_at is None else 2
        self.user = np.zeros(self.total, dtype=np.int64)
        """Each row's user (0, or 1 for the reference's rows)."""
        self.user[batch:] = 1
        self._candidate = (
            None if reference_at is None else np.concatenate([np.arange(batch), reference_at])
        )

    def of(self, per_candidate: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Values per candidate (first axis ``batch``) as values per row."""
        return per_candidate if self._candidate is None else per_candidate[self._candidate]

    def by_user(self, start: int, keys: int) -> Indices:
        """Indices of a user/context column whose block at ``start`` holds ``keys`` keys
        (one per user, or one for all)."""
        if keys == 1:
            return np.full(self.total, start, dtype=np.int64)
        return self.user + start


class RequestFeatureExtractor(FeatureExtractor):
    """Builds :class:`BatchFeatures` for (one user) x (many videos). One per thread."""

    def __init__(self, schema: FeatureSchema) -> None:
        super().__init__(schema)
        self._video_columns = [c for c in schema.categorical if SOURCES[c.source].per_video]
        self._request_columns = [c for c in schema.categorical if SOURCES[c.source].per_request]
        self._video_multi = [c for c in schema.multi_valued if SOURCES[c.source].per_video]
        self._by_table: dict[str, list[Categorical | MultiValued]] = {}
        for col in schema.embedded:
            self._by_table.setdefault(col.table_name(), []).append(col)
        self._video_dense = [
            j for j, c in enumerate(schema.dense) if SOURCES[c.source].per_video
        ]
        """Positions of the dense columns cached per video (see :class:`VideoTable`)."""
        self._request_dense = [
            (j, SOURCES[c.source].compute)
            for j, c in enumerate(schema.dense)
            if not SOURCES[c.source].per_video
        ]
        self._numbers = dense_fields(schema)
        self._affinity = reads_affinity(schema.dense)
        """Numeric catalog fields dense sources read: the columns of ``table.numbers``."""
        self.table = VideoTable(
            [c.source != "video_id" for c in self._video_columns],
            {c.name: c.max_len for c in self._video_multi},
            len(self._video_dense),
            self._describe,
            self._derive,
            number_fields=self._numbers,
            feature_fields=video_fields(schema),
        )
        """This extractor's per-video rows (:mod:`app.scoring.video_table`)."""
        self._constant_keys: dict[tuple[str, str], Keys] = {}
        """``(column, value)`` of user and context columns to their one-key array."""
        self._one_sequence = np.zeros(0, dtype=np.int64)
        """Zeros, the sequence row of every candidate (grown as needed, sliced per request)."""
        self._sequences = model_io.has_sequences(schema)

    def extract_request(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        videos: Sequence[Video],
        stats: Sequence[VideoStats],
    ) -> BatchFeatures:
        """Features of ``user_id`` against each of ``videos`` (with their ``stats``)."""
        idx = self.table.rows_of(videos)
        self.table.set_stats(idx, stats)
        return self.extract_rows(user_id, ts_ms, context, history, idx)

    def extract_rows(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        idx: Indices,
    ) -> BatchFeatures:
        """Features of ``user_id`` against the videos of :attr:`table` rows ``idx``.

        The rows' catalog fields and counters are what the table holds (see
        :meth:`VideoTable.lookup` for how they are kept fresh).
        """
        return self._extract(ts_ms, context, [(user_id, history)], idx, None)

    def extract_with_reference(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        idx: Indices,
        reference_user: str,
        reference_at: Indices,
    ) -> BatchFeatures:
        """:meth:`extract_rows` of ``user_id`` for ``idx``, then the rows of
        ``reference_user`` (no history, the same context) for ``idx[reference_at]``
        below them, in one batch that shares the videos' keys.

        Why: the cold start scores a request's new videos for an anonymous user too
        (:mod:`app.cold_start`). Each row reads the same keys as in its own
        :meth:`extract_rows` batch, so it scores the same; but the videos' keys are
        hashed, deduplicated and pulled once, and only the reference's own keys (its
        id, its crosses with the videos' columns, its empty history) are added.
        Sequence row 1 is the reference's (``S == 2``).
        """
        return self._extract(
            ts_ms, context, [(user_id, history), (reference_user, ())], idx, reference_at
        )

    def _extract(
        self,
        ts_ms: int,
        context: EventContext,
        users: list[tuple[str, Sequence[HistoryEntry]]],
        idx: Indices,
        reference_at: Indices | None,
    ) -> BatchFeatures:
        """The batch of :meth:`extract_with_reference` (``reference_at`` None: the first
        user's rows only). A row's *user* is 0 for the first ``len(idx)`` rows, 1 after."""
        table = self.table
        batch = len(idx)
        templates = [
            FeatureRow(user, "", ts_ms, None, context, tuple(history[: self.schema.history_len]))
            for user, history in users
        ]
        rows = _Rows(batch, reference_at)
        varying: dict[str, tuple[Keys, Indices]] = {}
        """Categorical columns of the videos: their distinct keys, each of the ``idx`` rows'
        position in them."""
        constant: dict[str, list[Keys]] = {}
        """Categorical columns of the user and context: per user, its one key."""
        shared: dict[str, list[Keys]] = {}
        """Multi-valued columns of the user (history): per user, its list."""
        ragged: dict[str, tuple[Keys, Indices, npt.NDArray[np.bool_]]] = {}
        """Multi-valued columns of the videos (tags): distinct keys, positions, ``(B, L)`` mask."""
        keys = table.categorical[idx]
        codes = table.codes[idx]
        for j, col in enumerate(self._video_columns):
            coder = table.coders[j]
            if coder is None:
                varying[col.name] = (keys[:, j], np.arange(batch, dtype=np.int64))
            else:
                varying[col.name] = coder.distinct(codes[:, j])
        for col in self._request_columns:
            constant[col.name] = [self.constant_key(col, t) for t in templates]
        for multi in self.schema.multi_valued:
            if SOURCES[multi.source].per_request:
                hasher = self._hasher(multi.space())
                shared[multi.name] = [
                    hasher.hash_many(SOURCES[multi.source].compute(t)[: multi.max_len])
                    for t in templates
                ]
            else:
                counts = table.multi_len[multi.name][idx]
                mask = np.arange(multi.max_len) < counts[:, None]
                flat = table.multi_codes[multi.name][idx][mask]
                ragged[multi.name] = (*table.multi_coders[multi.name].distinct(flat), mask)
        table_keys, column_indices = self._index_request_tables(
            rows, varying, constant, shared, ragged
        )
        wide_keys, wide_indices = self._index_request_wide(rows, varying, constant)
        dense = self._dense(ts_ms, templates[0].history, idx)
        if reference_at is not None:
            reference = self._dense(ts_ms, templates[1].history, idx[reference_at])
            dense = np.concatenate([dense, reference])
        return BatchFeatures(
            rows.total, table_keys, column_indices, wide_keys, wide_indices, dense,
            self._sequence_rows(rows) if self._sequences else None,
        )

    def _sequence_rows(self, rows: _Rows) -> Indices:
        """Each row's user: zeros for the first user's rows, then ones."""
        if len(self._one_sequence) < rows.total:
            self._one_sequence = np.zeros(max(rows.total, 2 * len(self._one_sequence)), np.int64)
        if rows.reference_at is None:
            return self._one_sequence[: rows.total]
        return rows.user

    def constant_key(self, col: Categorical, template: FeatureRow) -> Keys:
        """The one-key array of per-request column ``col`` for the request in ``template``."""
        value = SOURCES[col.source].compute(template)
        key = self._constant_keys.get((col.name, value))
        if key is None:
            if len(self._constant_keys) >= _CONSTANT_KEYS_MAX:
                self._constant_keys.clear()
            key = self._hasher(col.space()).hash_many([value])
            self._constant_keys[col.name, value] = key
        return key

    def _index_request_tables(
        self,
        rows: _Rows,
        varying: dict[str, tuple[Keys, Indices]],
        constant: dict[str, list[Keys]],
        shared: dict[str, list[Keys]],
        ragged: dict[str, tuple[Keys, Indices, npt.NDArray[np.bool_]]],
    ) -> tuple[dict[str, Keys], dict[str, Indices]]:
        """Keys per table, one block per column, and each column's indices into them.

        A column's block holds its distinct keys (see the module docstring);
        two columns of one table (videos and the history) are not merged, so
        a key in both is pulled twice: the same row, at no cost to scores. A
        user's column holds each user's key (one when they are the same).
        """
        table_keys: dict[str, Keys] = {}
        column_indices: dict[str, Indices] = {}
        for table, columns in self._by_table.items():
            blocks: list[Keys] = []
            for c in columns:
                if c.name in constant:
                    blocks.append(_distinct_users(constant[c.name]))
                elif c.name in shared:
                    lists = shared[c.name]
                    blocks.append(lists[0] if len(lists) == 1 else np.concatenate(lists))
                else:
                    blocks.append((varying[c.name] if c.name in varying else ragged[c.name])[0])
            table_keys[table] = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            pad = sum(map(len, blocks))
            start = 0
            for col, block in zip(columns, blocks, strict=True):
                name = col.name
                if name in constant:
                    column_indices[name] = rows.by_user(start, len(block))
                elif name in varying:
                    at = varying[name][1]
                    column_indices[name] = rows.of(at + start if start else at)
                elif isinstance(col, MultiValued):
                    if name in shared:  # one row per user, read by its candidates
                        lists = shared[name]
                        padded = np.full((len(lists), col.max_len), pad, dtype=np.int64)
                        first = start
                        for user, values in enumerate(lists):
                            padded[user, : len(values)] = np.arange(first, first + len(values))
                            first += len(values)
                    else:
                        _, positions, mask = ragged[name]
                        padded = np.full((rows.batch, col.max_len), pad, dtype=np.int64)
                        padded[mask] = positions + start
                        padded = rows.of(padded)
                    column_indices[name] = padded
                start += len(block)
        return table_keys, column_indices

    def _index_request_wide(
        self,
        rows: _Rows,
        varying: dict[str, tuple[Keys, Indices]],
        constant: dict[str, list[Keys]],
    ) -> tuple[Keys, Indices]:
        """The wide part's keys, one block per wide column, and ``(rows, W)`` indices.

        A cross of user/context columns with one video column is mixed for that
        column's distinct keys only and shares its positions (once per user whose
        keys differ); a cross of two or more video columns is mixed per row and
        deduplicated by sorting.
        """
        blocks: list[Keys] = []
        positions: list[Indices] = []
        """Per wide column: each row's position in its block."""
        users = rows.users
        for col in self.schema.categorical:
            if col.wide:
                if col.name in constant:
                    block = _distinct_users(constant[col.name])
                    blocks.append(block)
                    positions.append(rows.by_user(0, len(block)))
                else:
                    blocks.append(varying[col.name][0])
                    positions.append(rows.of(varying[col.name][1]))
        for cross in self.schema.crossed:
            by_video = [name for name in cross.columns if name not in constant]
            differs = any(
                len(_distinct_users(constant[name])) > 1
                for name in cross.columns if name in constant
            )
            mixed = [  # per user (one when no part differs), the cross's keys
                self._cross_block(cross, by_video, varying, constant, user, rows)
                for user in range(users if differs else 1)
            ]
            block, at = mixed[0]
            if len(mixed) == 2:
                second, at_second = mixed[1]
                block = np.concatenate([block, second])
                at = np.concatenate([at[: rows.batch], at_second + len(mixed[0][0])])
            blocks.append(block)
            positions.append(at)
        if not blocks:
            return np.zeros(0, np.uint64), np.zeros((rows.total, 0), np.int64)
        indices = np.empty((rows.total, len(blocks)), dtype=np.int64)
        start = 0
        for j, (block, where) in enumerate(zip(blocks, positions, strict=True)):
            np.add(where, start, out=indices[:, j])
            start += len(block)
        return np.concatenate(blocks), indices

    def _cross_block(
        self,
        cross: Crossed,
        by_video: list[str],
        varying: dict[str, tuple[Keys, Indices]],
        constant: dict[str, list[Keys]],
        user: int,
        rows: _Rows,
    ) -> tuple[Keys, Indices]:
        """``cross``'s keys with ``user``'s keys of the user/context columns, and the
        position of each of its rows (every row when ``user`` is 0; the reference's
        rows when it is 1)."""
        every = user == 0
        if len(by_video) > 1:  # per row, then sorted
            parts = []
            for name in cross.columns:
                if name in constant:
                    parts.append(constant[name][user])
                    continue
                distinct, at = varying[name]
                parts.append(distinct[at if every else at[rows.reference_at]])
            unique, (at,) = unique_inverse([cross_keys(cross.name, parts)])
            return unique, rows.of(at) if every else at
        # Over the one video column's distinct keys (or one key): the user and
        # context parts, one key each, broadcast.
        video_at = np.zeros(rows.batch, np.int64)  # no video column: one key for all
        broadcast: list[Keys] = []
        for name in cross.columns:
            if name in constant:
                broadcast.append(constant[name][user])
            else:
                distinct, video_at = varying[name]
                broadcast.append(distinct)
        block = cross_keys(cross.name, broadcast)
        if every:
            return block, rows.of(video_at)
        return block, video_at[rows.reference_at]

    def _describe(self, video: Video) -> tuple[list[int], dict[str, Keys]]:
        """A video's keys for the table's video columns (see :class:`VideoTable`)."""
        row = FeatureRow("", video.video_id, 0, video)
        categorical = [
            int(self._hasher(c.space()).hash_many([SOURCES[c.source].compute(row)])[0])
            for c in self._video_columns
        ]
        multi = {
            c.name: self._hasher(c.space()).hash_many(
                SOURCES[c.source].compute(row)[: c.max_len]
            )
            for c in self._video_multi
        }
        return categorical, multi

    def _derive(
        self, numbers: npt.NDArray[np.float64], stats: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float32]:
        """The dense columns cached per video, from their numeric fields and counters."""
        n = len(numbers)
        inputs = DenseInputs(
            ts_ms=np.zeros(n),  # read only by sources that are not cached per video
            fields={name: numbers[:, j] for j, name in enumerate(self._numbers)},
            stats=stats,
            history_len=np.zeros(n),
        )
        return dense_matrix([self.schema.dense[j] for j in self._video_dense], inputs)

    def _dense(
        self, ts_ms: int, history: Sequence[HistoryEntry], idx: Indices
    ) -> npt.NDArray[np.float32]:
        table = self.table
        batch = len(idx)
        numbers = table.numbers[idx]
        inputs = DenseInputs(
            ts_ms=np.full(batch, float(ts_ms)),
            fields={name: numbers[:, j] for j, name in enumerate(self._numbers)},
            stats=table.stats[idx],
            history_len=np.full(batch, float(len(history))),
            affinity=table.affinity(history, idx) if self._affinity else None,
        )
        out = np.empty((batch, len(self.schema.dense)), dtype=np.float32)
        if self._video_dense:
            out[:, self._video_dense] = table.dense[idx]
        for j, source in self._request_dense:
            out[:, j] = source(inputs)
        return out
