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

The result is the same :class:`~feature_store.features.BatchFeatures` the
generic extractor produces for the equivalent :class:`FeatureRow` list (a
test checks equality), indexed by the same code (the base class's
``_index_tables`` and ``_index_wide``), so training and serving cannot drift.
Columns whose source this module does not know fall back to the generic path.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, is_, itemgetter

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


class _VideoTable:
    """Video-level keys and numbers of every video seen, one row per video.

    Gathering 500 rows is one fancy-indexing op per matrix instead of 500
    Python-level conversions. A row is reused while its catalog record is the
    same object (memory catalog) or equal (Redis returns fresh objects);
    a changed record gets a fresh row. Its counters and the dense values
    derived from them are kept with the counters object they came from and
    recomputed when another object comes (the stores hand out immutable
    counters: the memory store the same object until it changes, the service's
    Redis cache the same object for its TTL). Emptied at ``_CACHE_MAX`` rows.
    """

    def __init__(self, n_categorical: int, multi_lens: dict[str, int], n_dense: int) -> None:
        self.n_categorical = n_categorical
        self.multi_lens = multi_lens
        self.n_dense = n_dense
        self.clear()

    def clear(self, capacity: int = 1024) -> None:
        self.row_of: dict[str, int] = {}
        self.videos: list[Video] = []
        self.fingerprints: list[tuple[object, ...]] = []
        self.categorical = np.zeros((capacity, self.n_categorical), dtype=np.uint64)
        self.numbers = np.zeros((capacity, 2), dtype=np.float64)
        self.multi = {
            n: np.zeros((capacity, k), dtype=np.uint64) for n, k in self.multi_lens.items()
        }
        self.multi_len = {n: np.zeros(capacity, dtype=np.int64) for n in self.multi_lens}
        self.stats_of: list[VideoStats | None] = []
        self.stats = np.zeros((capacity, len(STAT_FIELDS)), dtype=np.float64)
        self.dense = np.zeros((capacity, self.n_dense), dtype=np.float32)

    def add(self, video: Video, categorical: list[int], multi: dict[str, Keys]) -> int:
        row = len(self.videos)
        if row == len(self.numbers):
            grow = len(self.numbers)
            self.categorical = np.concatenate(
                [self.categorical, np.zeros_like(self.categorical[:grow])]
            )
            self.numbers = np.concatenate([self.numbers, np.zeros_like(self.numbers[:grow])])
            self.stats = np.concatenate([self.stats, np.zeros_like(self.stats[:grow])])
            self.dense = np.concatenate([self.dense, np.zeros_like(self.dense[:grow])])
            for n in self.multi:
                self.multi[n] = np.concatenate([self.multi[n], np.zeros_like(self.multi[n][:grow])])
                self.multi_len[n] = np.concatenate([self.multi_len[n], np.zeros(grow, np.int64)])
        self.videos.append(video)
        self.stats_of.append(None)
        self.fingerprints.append(_fingerprint(video))
        self.row_of[video.video_id] = row
        self.categorical[row] = categorical
        self.numbers[row] = (video.uploaded_at, video.duration_ms)
        for n, keys in multi.items():
            self.multi[n][row, : len(keys)] = keys
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
            len(self._video_columns),
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
        per_row: dict[str, Keys] = {}
        """Categorical columns that vary by video: (B,) keys."""
        constant: dict[str, Keys] = {}
        """Categorical columns of the user and context: one key, the same for every row."""
        shared: dict[str, Keys] = {}
        """Multi-valued columns of the user (history): the same list for every row."""
        ragged: dict[str, tuple[Keys, npt.NDArray[np.int64]]] = {}
        """Multi-valued columns of the videos (tags): flat keys and per-row counts."""
        gathered = table.categorical[idx]
        for j, col in enumerate(self._video_columns):
            per_row[col.name] = gathered[:, j]
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
                ragged[multi.name] = (table.multi[multi.name][idx][mask], counts)
        table_keys, column_indices = self._index_request_tables(
            batch, per_row, constant, shared, ragged
        )
        wide_keys, wide_indices = self._index_request_wide(batch, per_row, constant)
        dense = self._dense(ts_ms, history, idx, stats)
        return BatchFeatures(batch, table_keys, column_indices, wide_keys, wide_indices, dense)

    def _index_request_tables(
        self,
        batch: int,
        per_row: dict[str, Keys],
        constant: dict[str, Keys],
        shared: dict[str, Keys],
        ragged: dict[str, tuple[Keys, npt.NDArray[np.int64]]],
    ) -> tuple[dict[str, Keys], dict[str, Indices]]:
        """Unique keys per table and indices into them; same result as the base class.

        The unique set is built from each column's *distinct* inputs (one key
        for a user column, the history once rather than once per row), then
        every index is a position in it (:func:`unique_inverse`): sorted unique
        keys and their positions are exactly what ``np.unique(...,
        return_inverse=True)`` gives.
        """
        table_keys: dict[str, Keys] = {}
        column_indices: dict[str, Indices] = {}
        for table, columns in self._by_table.items():
            parts = []
            for col in columns:
                name = col.name
                if name in constant:
                    parts.append(constant[name])
                elif name in per_row:
                    parts.append(per_row[name])
                elif name in shared:
                    parts.append(shared[name])
                else:
                    parts.append(ragged[name][0])
            unique, positions = unique_inverse(parts)
            table_keys[table] = unique
            pad = len(unique)
            for col, at in zip(columns, positions, strict=True):
                name = col.name
                if name in constant:
                    column_indices[name] = np.full(batch, int(at[0]), dtype=np.int64)
                elif name in per_row:
                    column_indices[name] = at
                elif isinstance(col, MultiValued) and name in shared:
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    padded[:, : len(at)] = at
                    column_indices[name] = padded
                elif isinstance(col, MultiValued):
                    counts = ragged[name][1]
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    padded[np.arange(col.max_len) < counts[:, None]] = at
                    column_indices[name] = padded
        return table_keys, column_indices

    def _index_request_wide(
        self, batch: int, per_row: dict[str, Keys], constant: dict[str, Keys]
    ) -> tuple[Keys, Indices]:
        """The wide part's unique keys and ``(B, W)`` indices; same result as the base class."""
        parts: list[Keys] = [
            constant[c.name] if c.name in constant else per_row[c.name]
            for c in self.schema.categorical
            if c.wide
        ]
        for cross, seed in self._cross_seeds:
            # cross_keys' mix, with user/context parts kept as one key until a
            # per-video part comes: the same keys, fewer 500-wide mixes.
            acc = seed
            for name in cross.columns:
                acc = splitmix64(acc ^ (constant[name] if name in constant else per_row[name]))
            parts.append(acc)  # one key when every part is the user's or the context's
        if not parts:
            return np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
        unique, positions = unique_inverse(parts)
        indices = np.empty((batch, len(parts)), dtype=np.int64)
        for j, at in enumerate(positions):
            indices[:, j] = at
        return unique, indices

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
