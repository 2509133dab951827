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

The result means what the generic extractor's
:class:`~feature_store.features.BatchFeatures` for the equivalent
:class:`FeatureRow` list means: for every column and row, the key its index
points at is the same key (tests check this), so training and serving cannot
drift. Only the order of a table's keys differs (the trainer's are sorted and
unique; these are grouped by column), which the model never sees: it gathers
rows by index. Columns whose source this module does not know fall back to
the generic path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from app.scoring.video_table import VideoTable
from feature_store.activity.base import NO_STATS, HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features.columns import (
    CATEGORICAL_SOURCES,
    MULTI_SOURCES,
    Categorical,
    FeatureRow,
    MultiValued,
)
from feature_store.features.dense import (
    DENSE_SOURCES,
    DenseInputs,
    dense_matrix,
)
from feature_store.features.extract import BatchFeatures, FeatureExtractor, Indices
from feature_store.features.keys import Keys, feature_key, splitmix64
from feature_store.features.schema import FeatureSchema

REQUEST_CATEGORICAL = {
    "user_id",
    "device",
    "os",
    "country",
    "surface",
    "hour_of_day",
    "position_bucket",
    "age_group",
    "gender",
    "occupation",
}
"""Categorical sources that depend only on the user, the context and the clock."""
VIDEO_CATEGORICAL = {"video_id", "creator_id", "category", "duration_bucket"}
"""Categorical sources that depend only on the catalog record."""
VIDEO_DENSE = {
    "duration_log_s",
    "log_engagements",
    "log_impressions",
    "finish_rate",
    "like_rate",
    "skip_rate",
}
"""Dense sources that depend only on the catalog record and the video's counters."""
REQUEST_MULTI = {"history_videos"}
VIDEO_MULTI = {"tags"}
_MASK64 = (1 << 64) - 1
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


class RequestFeatureExtractor(FeatureExtractor):
    """Builds :class:`BatchFeatures` for (one user) x (many videos). One per thread."""

    def __init__(self, schema: FeatureSchema) -> None:
        super().__init__(schema)
        self.vectorised = (
            all(c.source in REQUEST_CATEGORICAL | VIDEO_CATEGORICAL for c in schema.categorical)
            and all(c.source in REQUEST_MULTI | VIDEO_MULTI for c in schema.multi_valued)
            and all(c.source in DENSE_SOURCES for c in schema.dense)
        )
        self._video_columns = [c for c in schema.categorical if c.source in VIDEO_CATEGORICAL]
        self._video_multi = [c for c in schema.multi_valued if c.source in VIDEO_MULTI]
        self._by_table: dict[str, list[Categorical | MultiValued]] = {}
        for col in schema.embedded:
            self._by_table.setdefault(col.table_name(), []).append(col)
        self._cross_seeds = [
            (cross, np.full(1, feature_key("cross", cross.name) & _MASK64, dtype=np.uint64))
            for cross in schema.crossed
        ]
        self._video_dense = [j for j, c in enumerate(schema.dense) if c.source in VIDEO_DENSE]
        """Positions of the dense columns cached per video (see :class:`_VideoTable`)."""
        self._request_dense = [
            (j, DENSE_SOURCES[c.source])
            for j, c in enumerate(schema.dense)
            if c.source not in VIDEO_DENSE
        ]
        self.table = VideoTable(
            [c.source != "video_id" for c in self._video_columns],
            {c.name: c.max_len for c in self._video_multi},
            len(self._video_dense),
            self._describe,
            self._derive,
        )
        """This extractor's per-video rows (:mod:`app.scoring.video_table`)."""
        self._constant_keys: dict[tuple[str, str], Keys] = {}
        """``(column, value)`` of user and context columns to their one-key array."""

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
        if not self.vectorised:
            rows = [
                FeatureRow(user_id, v.video_id, ts_ms, v, context, tuple(history), s)
                for v, s in zip(videos, stats, strict=True)
            ]
            return self.extract(rows)
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
        table = self.table
        if not self.vectorised:
            at = idx.tolist()
            rows = [
                FeatureRow(
                    user_id,
                    table.videos[r].video_id,
                    ts_ms,
                    table.videos[r],
                    context,
                    tuple(history),
                    table.stats_of[r] or NO_STATS,
                )
                for r in at
            ]
            return self.extract(rows)
        batch = len(idx)
        template = FeatureRow(user_id, "", ts_ms, None, context, tuple(history))
        varying: dict[str, tuple[Keys, Indices]] = {}
        """Categorical columns of the videos: their distinct keys, each row's position in them."""
        constant: dict[str, Keys] = {}
        """Categorical columns of the user and context: one key, the same for every row."""
        shared: dict[str, Keys] = {}
        """Multi-valued columns of the user (history): the same list for every row."""
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
        for col in self.schema.categorical:
            if col.source in REQUEST_CATEGORICAL:
                value = CATEGORICAL_SOURCES[col.source](template)
                key = self._constant_keys.get((col.name, value))
                if key is None:
                    if len(self._constant_keys) >= _CONSTANT_KEYS_MAX:
                        self._constant_keys.clear()
                    key = self._hasher(col.space()).hash_many([value])
                    self._constant_keys[col.name, value] = key
                constant[col.name] = key
        for multi in self.schema.multi_valued:
            if multi.source in REQUEST_MULTI:
                values = MULTI_SOURCES[multi.source](template)[: multi.max_len]
                shared[multi.name] = self._hasher(multi.space()).hash_many(values)
            else:
                counts = table.multi_len[multi.name][idx]
                mask = np.arange(multi.max_len) < counts[:, None]
                flat = table.multi_codes[multi.name][idx][mask]
                ragged[multi.name] = (*table.multi_coders[multi.name].distinct(flat), mask)
        table_keys, column_indices = self._index_request_tables(
            batch, varying, constant, shared, ragged
        )
        wide_keys, wide_indices = self._index_request_wide(batch, varying, constant)
        dense = self._dense(ts_ms, history, idx)
        return BatchFeatures(batch, table_keys, column_indices, wide_keys, wide_indices, dense)

    def _index_request_tables(
        self,
        batch: int,
        varying: dict[str, tuple[Keys, Indices]],
        constant: dict[str, Keys],
        shared: dict[str, Keys],
        ragged: dict[str, tuple[Keys, Indices, npt.NDArray[np.bool_]]],
    ) -> tuple[dict[str, Keys], dict[str, Indices]]:
        """Keys per table, one block per column, and each column's indices into them.

        A column's block holds its distinct keys (see the module docstring);
        two columns of one table (videos and the history) are not merged, so
        a key in both is pulled twice: the same row, at no cost to scores.
        """
        table_keys: dict[str, Keys] = {}
        column_indices: dict[str, Indices] = {}
        for table, columns in self._by_table.items():
            blocks = [
                constant[c.name]
                if c.name in constant
                else shared[c.name]
                if c.name in shared
                else (varying[c.name] if c.name in varying else ragged[c.name])[0]
                for c in columns
            ]
            table_keys[table] = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            pad = sum(map(len, blocks))
            start = 0
            for col, block in zip(columns, blocks, strict=True):
                name = col.name
                if name in constant:
                    column_indices[name] = np.full(batch, start, dtype=np.int64)
                elif name in varying:
                    at = varying[name][1]
                    column_indices[name] = at + start if start else at
                elif isinstance(col, MultiValued):
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    if name in shared:
                        padded[:, : len(block)] = np.arange(start, start + len(block))
                    else:
                        _, at, mask = ragged[name]
                        padded[mask] = at + start
                    column_indices[name] = padded
                start += len(block)
        return table_keys, column_indices

    def _index_request_wide(
        self,
        batch: int,
        varying: dict[str, tuple[Keys, Indices]],
        constant: dict[str, Keys],
    ) -> tuple[Keys, Indices]:
        """The wide part's keys, one block per wide column, and ``(B, W)`` indices.

        A cross of user/context columns with one video column is mixed for that
        column's distinct keys only and shares its positions; a cross of two or
        more video columns is mixed per row and deduplicated by sorting.
        """
        blocks: list[Keys] = []
        positions: list[Indices | None] = []
        """Per wide column: each row's position in its block (None: one key for all)."""
        for col in self.schema.categorical:
            if col.wide:
                if col.name in constant:
                    blocks.append(constant[col.name])
                    positions.append(None)
                else:
                    blocks.append(varying[col.name][0])
                    positions.append(varying[col.name][1])
        for cross, seed in self._cross_seeds:
            by_video = {name for name in cross.columns if name not in constant}
            if len(by_video) > 1:  # per row, then sorted
                acc = seed
                for name in cross.columns:
                    part = constant.get(name)
                    if part is None:
                        distinct, at = varying[name]
                        part = distinct[at]
                    acc = splitmix64(acc ^ part)
                unique, (at,) = unique_inverse([acc])
                blocks.append(unique)
                positions.append(at)
                continue
            # cross_keys' mix over the one video column's distinct keys (or one key).
            distinct, at = varying[by_video.pop()] if by_video else (None, None)
            acc = seed
            for name in cross.columns:
                acc = splitmix64(acc ^ (constant[name] if name in constant else distinct))
            blocks.append(acc)
            positions.append(at)
        if not blocks:
            return np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
        indices = np.empty((batch, len(blocks)), dtype=np.int64)
        start = 0
        for j, (block, at) in enumerate(zip(blocks, positions, strict=True)):
            if at is None:
                indices[:, j] = start
            else:
                np.add(at, start, out=indices[:, j])
            start += len(block)
        return np.concatenate(blocks), indices

    def _describe(self, video: Video) -> tuple[list[int], dict[str, Keys]]:
        """A video's keys for the table's video columns (see :class:`VideoTable`)."""
        row = FeatureRow("", video.video_id, 0, video)
        categorical = [
            int(self._hasher(c.space()).hash_many([CATEGORICAL_SOURCES[c.source](row)])[0])
            for c in self._video_columns
        ]
        multi = {
            c.name: self._hasher(c.space()).hash_many(MULTI_SOURCES[c.source](row)[: c.max_len])
            for c in self._video_multi
        }
        return categorical, multi

    def _derive(
        self, numbers: npt.NDArray[np.float64], stats: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float32]:
        """The dense columns cached per video, from ``(uploaded_at, duration_ms)`` and counters."""
        n = len(numbers)
        inputs = DenseInputs(
            ts_ms=np.zeros(n),  # unused by VIDEO_DENSE sources
            uploaded_at=numbers[:, 0],
            duration_ms=numbers[:, 1],
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
            uploaded_at=numbers[:, 0],
            duration_ms=numbers[:, 1],
            stats=table.stats[idx],
            history_len=np.full(batch, float(len(history))),
        )
        out = np.empty((batch, len(self.schema.dense)), dtype=np.float32)
        if self._video_dense:
            out[:, self._video_dense] = table.dense[idx]
        for j, source in self._request_dense:
            out[:, j] = source(inputs)
        return out
