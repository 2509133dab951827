"""Request-shaped feature extraction: one user, many candidate videos.

:class:`~feature_store.features.FeatureExtractor` evaluates every column on
every row in Python, about 9 ms for 500 candidates: more than the whole
latency budget. A recommendation request has structure it can exploit:

- user and context columns (user, device, country, surface, hour, history...)
  are the same for every candidate, so they are computed once and broadcast;
- video columns (video, creator, category, duration, tags) depend only on the
  catalog record, so their hashed keys are cached per video;
- dense columns are computed with numpy over arrays of the candidates' fields;
  those that depend only on the catalog record and the counters (duration,
  engagement rates...) are cached per video with the counters they came from,
  and recomputed for a video whose counters object changed, so a request
  computes only the clock- and user-dependent ones (age, recency, history).

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
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import HistoryEntry, VideoStats
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
    STAT_FIELDS,
    DenseInputs,
    dense_matrix,
    stats_matrix,
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
_fingerprint = attrgetter("creator_id", "category", "tags", "duration_ms", "uploaded_at")
"""The catalog fields video-level features read (besides the id, the cache key)."""
_CACHE_MAX = 200_000
_MASK64 = (1 << 64) - 1


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


class _Codes:
    """Small integer codes for the distinct keys of one video column.

    A code is given when a video carrying the key is cached, so a request
    finds its distinct keys with a marker array over codes (:meth:`distinct`)
    rather than by sorting 64-bit keys. Codes are never reused: the table
    that owns them is emptied, codes included, at ``_CACHE_MAX`` videos.
    """

    def __init__(self) -> None:
        self.code_of: dict[int, int] = {}
        self.keys = np.zeros(256, dtype=np.uint64)
        """Code to key."""

    def code(self, key: int) -> int:
        code = self.code_of.get(key)
        if code is None:
            code = self.code_of[key] = len(self.code_of)
            if code == len(self.keys):
                self.keys = np.concatenate([self.keys, np.zeros_like(self.keys)])
            self.keys[code] = key
        return code

    def distinct(self, codes: npt.NDArray[np.int32]) -> tuple[Keys, Indices]:
        """The distinct keys among ``codes`` (in code order) and each code's position in them."""
        n = len(self.code_of)
        mark = np.zeros(n, dtype=np.bool_)
        mark[codes] = True
        present = np.flatnonzero(mark)
        position = np.empty(n, dtype=np.int64)
        position[present] = np.arange(len(present))
        return self.keys[present], position[codes]


class _VideoTable:
    """Video-level keys, codes and numbers of every video seen, one row per video.

    Gathering 500 rows is one fancy-indexing op per matrix instead of 500
    Python-level conversions. A row is reused while its catalog record is the
    same object (memory catalog) or equal (Redis returns fresh objects);
    a changed record gets a fresh row. Its counters and the dense values
    derived from them are kept with the counters object they came from and
    recomputed when another object comes (the stores hand out immutable
    counters: the memory store the same object until it changes, the service's
    Redis cache the same object for its TTL). Emptied at ``_CACHE_MAX`` rows.

    Video ids get no codes (``coders[j] is None``): every video has its own,
    and a request's candidates are distinct already.
    """

    def __init__(self, coded: list[bool], multi_lens: dict[str, int], n_dense: int) -> None:
        self.coded = coded
        self.multi_lens = multi_lens
        self.n_dense = n_dense
        self.clear()

    def clear(self, capacity: int = 1024) -> None:
        n_categorical = len(self.coded)
        self.row_of: dict[str, int] = {}
        self.videos: list[Video] = []
        self.fingerprints: list[tuple[object, ...]] = []
        self.categorical = np.zeros((capacity, n_categorical), dtype=np.uint64)
        self.codes = np.zeros((capacity, n_categorical), dtype=np.int32)
        self.coders = [_Codes() if coded else None for coded in self.coded]
        self.numbers = np.zeros((capacity, 2), dtype=np.float64)
        self.multi = {
            n: np.zeros((capacity, k), dtype=np.uint64) for n, k in self.multi_lens.items()
        }
        self.multi_codes = {
            n: np.zeros((capacity, k), dtype=np.int32) for n, k in self.multi_lens.items()
        }
        self.multi_coders = {n: _Codes() for n in self.multi_lens}
        self.multi_len = {n: np.zeros(capacity, dtype=np.int64) for n in self.multi_lens}
        self.stats_of: list[VideoStats | None] = []
        self.stats = np.zeros((capacity, len(STAT_FIELDS)), dtype=np.float64)
        self.dense = np.zeros((capacity, self.n_dense), dtype=np.float32)

    def _grow(self) -> None:
        def doubled(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.concatenate([array, np.zeros_like(array)])

        self.categorical = doubled(self.categorical)
        self.codes = doubled(self.codes)
        self.numbers = doubled(self.numbers)
        self.stats = doubled(self.stats)
        self.dense = doubled(self.dense)
        for n in self.multi:
            self.multi[n] = doubled(self.multi[n])
            self.multi_codes[n] = doubled(self.multi_codes[n])
            self.multi_len[n] = doubled(self.multi_len[n])

    def add(self, video: Video, categorical: list[int], multi: dict[str, Keys]) -> int:
        row = len(self.videos)
        if row == len(self.numbers):
            self._grow()
        self.videos.append(video)
        self.stats_of.append(None)
        self.fingerprints.append(_fingerprint(video))
        self.row_of[video.video_id] = row
        self.categorical[row] = categorical
        self.codes[row] = [
            coder.code(key) if coder is not None else 0
            for coder, key in zip(self.coders, categorical, strict=True)
        ]
        self.numbers[row] = (video.uploaded_at, video.duration_ms)
        for n, keys in multi.items():
            coder = self.multi_coders[n]
            self.multi[n][row, : len(keys)] = keys
            self.multi_codes[n][row, : len(keys)] = [coder.code(k) for k in keys.tolist()]
            self.multi_len[n][row] = len(keys)
        return row


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
        self._table = _VideoTable(
            [c.source != "video_id" for c in self._video_columns],
            {c.name: c.max_len for c in self._video_multi},
            len(self._video_dense),
        )

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
        batch = len(videos)
        template = FeatureRow(user_id, "", ts_ms, None, context, tuple(history))
        idx = self._rows_of(videos)
        table = self._table
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
                constant[col.name] = self._hasher(col.space()).hash_many([value])
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
        dense = self._dense(ts_ms, history, idx, stats)
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

    def _rows_of(self, videos: Sequence[Video]) -> npt.NDArray[np.int64]:
        table = self._table
        if len(table.videos) + len(videos) > _CACHE_MAX:
            table.clear()
        row_of, cached = table.row_of, table.videos
        rows = [row_of.get(v.video_id, -1) for v in videos]
        if rows and -1 not in rows:
            known = itemgetter(*rows)(cached) if len(rows) > 1 else (cached[rows[0]],)
            if all(map(is_, known, videos)):  # the usual case: same records as last time
                return np.fromiter(rows, np.int64, len(rows))
        for i, (row, video) in enumerate(zip(rows, videos, strict=True)):
            # Redis hands out new objects: compare the fields features read, not the object.
            if row < 0:
                rows[i] = self._add(video)
            elif cached[row] is not video:
                if table.fingerprints[row] != _fingerprint(video):
                    rows[i] = self._add(video)
                else:
                    cached[row] = video  # the same record: next time the identity check holds
        return np.fromiter(rows, np.int64, len(rows))

    def _add(self, video: Video) -> int:
        row = FeatureRow("", video.video_id, 0, video)
        categorical = [
            int(self._hasher(c.space()).hash_many([CATEGORICAL_SOURCES[c.source](row)])[0])
            for c in self._video_columns
        ]
        multi = {
            c.name: self._hasher(c.space()).hash_many(MULTI_SOURCES[c.source](row)[: c.max_len])
            for c in self._video_multi
        }
        return self._table.add(video, categorical, multi)

    def _dense(
        self,
        ts_ms: int,
        history: Sequence[HistoryEntry],
        idx: npt.NDArray[np.int64],
        stats: Sequence[VideoStats],
    ) -> npt.NDArray[np.float32]:
        table = self._table
        self._refresh_stats(idx, stats)
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

    def _refresh_stats(self, idx: npt.NDArray[np.int64], stats: Sequence[VideoStats]) -> None:
        """Recompute the cached counters and dense values of rows whose counters changed."""
        table = self._table
        rows = idx.tolist()
        if not rows:
            return
        cached = table.stats_of
        known = itemgetter(*rows)(cached) if len(rows) > 1 else (cached[rows[0]],)
        if all(map(is_, known, stats)):
            return
        # Another object with the same counters (a store's fresh zeros for a video
        # without events) is no change; comparing costs only on a mismatch.
        changed = []
        for i, (k, s) in enumerate(zip(known, stats, strict=True)):
            if k is not s:
                if k != s:
                    changed.append(i)
                else:
                    cached[rows[i]] = s  # next time the identity check holds
        if not changed:
            return
        at = idx[changed]
        fresh = [stats[i] for i in changed]
        matrix = stats_matrix(fresh)
        table.stats[at] = matrix
        for i, row in zip(changed, at.tolist(), strict=True):
            cached[row] = stats[i]
        if self._video_dense:
            numbers = table.numbers[at]
            n = len(at)
            inputs = DenseInputs(
                ts_ms=np.zeros(n),  # unused by VIDEO_DENSE sources
                uploaded_at=numbers[:, 0],
                duration_ms=numbers[:, 1],
                stats=matrix,
                history_len=np.zeros(n),
            )
            columns = [self.schema.dense[j] for j in self._video_dense]
            table.dense[at] = dense_matrix(columns, inputs)
