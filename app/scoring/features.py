"""Request-shaped feature extraction: one user, many candidate videos.

:class:`~feature_store.features.FeatureExtractor` evaluates every column on
every row in Python, about 9 ms for 500 candidates: more than the whole
latency budget. A recommendation request has structure it can exploit:

- user and context columns (user, device, country, surface, hour, history...)
  are the same for every candidate, so they are computed once and broadcast;
- video columns (video, creator, category, duration, tags) depend only on the
  catalog record, so their hashed keys are cached per video;
- dense columns are computed with numpy over arrays of the candidates' fields.

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
from feature_store.features.dense import DENSE_SOURCES, DenseInputs, dense_matrix, stats_matrix
from feature_store.features.extract import BatchFeatures, FeatureExtractor, Indices
from feature_store.features.keys import Keys, cross_keys
from feature_store.features.schema import FeatureSchema

REQUEST_CATEGORICAL = {
    "user_id",
    "device",
    "os",
    "country",
    "surface",
    "hour_of_day",
    "position_bucket",
}
"""Categorical sources that depend only on the user, the context and the clock."""
VIDEO_CATEGORICAL = {"video_id", "creator_id", "category", "duration_bucket"}
"""Categorical sources that depend only on the catalog record."""
REQUEST_MULTI = {"history_videos"}
VIDEO_MULTI = {"tags"}
_fingerprint = attrgetter("creator_id", "category", "tags", "duration_ms", "uploaded_at")
"""The catalog fields video-level features read (besides the id, the cache key)."""
_CACHE_MAX = 200_000


class _VideoTable:
    """Video-level keys and numbers of every video seen, one row per video.

    Gathering 500 rows is one fancy-indexing op per matrix instead of 500
    Python-level conversions. A row is reused while its catalog record is the
    same object (memory catalog) or equal (Redis returns fresh objects);
    a changed record gets a fresh row. Emptied when it reaches ``_CACHE_MAX``.
    """

    def __init__(self, n_categorical: int, multi_lens: dict[str, int]) -> None:
        self.n_categorical = n_categorical
        self.multi_lens = multi_lens
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

    def add(self, video: Video, categorical: list[int], multi: dict[str, Keys]) -> int:
        row = len(self.videos)
        if row == len(self.numbers):
            grow = len(self.numbers)
            self.categorical = np.concatenate(
                [self.categorical, np.zeros_like(self.categorical[:grow])]
            )
            self.numbers = np.concatenate([self.numbers, np.zeros_like(self.numbers[:grow])])
            for n in self.multi:
                self.multi[n] = np.concatenate([self.multi[n], np.zeros_like(self.multi[n][:grow])])
                self.multi_len[n] = np.concatenate([self.multi_len[n], np.zeros(grow, np.int64)])
        self.videos.append(video)
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
        self._table = _VideoTable(
            len(self._video_columns), {c.name: c.max_len for c in self._video_multi}
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
        dense = self._dense(ts_ms, history, table.numbers[idx], stats)
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
        every index is a ``searchsorted`` into it: sorted unique keys and their
        positions are exactly what ``np.unique(..., return_inverse=True)`` gives.
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
            unique = np.unique(np.concatenate(parts))
            table_keys[table] = unique
            pad = len(unique)
            for col in columns:
                name = col.name
                if name in constant:
                    at = int(np.searchsorted(unique, constant[name][0]))
                    column_indices[name] = np.full(batch, at, dtype=np.int64)
                elif name in per_row:
                    column_indices[name] = np.searchsorted(unique, per_row[name]).astype(np.int64)
                elif isinstance(col, MultiValued) and name in shared:
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    padded[:, : len(shared[name])] = np.searchsorted(unique, shared[name])
                    column_indices[name] = padded
                elif isinstance(col, MultiValued):
                    flat, counts = ragged[name]
                    padded = np.full((batch, col.max_len), pad, dtype=np.int64)
                    padded[np.arange(col.max_len) < counts[:, None]] = np.searchsorted(unique, flat)
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
        for cross in self.schema.crossed:
            if all(name in constant for name in cross.columns):
                parts.append(cross_keys(cross.name, [constant[n] for n in cross.columns]))
            else:
                inputs = [
                    np.broadcast_to(constant[n], (batch,)) if n in constant else per_row[n]
                    for n in cross.columns
                ]
                parts.append(cross_keys(cross.name, inputs))
        if not parts:
            return np.zeros(0, np.uint64), np.zeros((batch, 0), np.int64)
        unique = np.unique(np.concatenate(parts))
        indices = np.empty((batch, len(parts)), dtype=np.int64)
        for j, keys in enumerate(parts):
            indices[:, j] = np.searchsorted(unique, keys)
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
            if row < 0 or (
                cached[row] is not video and table.fingerprints[row] != _fingerprint(video)
            ):
                rows[i] = self._add(video)
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
        numbers: npt.NDArray[np.float64],
        stats: Sequence[VideoStats],
    ) -> npt.NDArray[np.float32]:
        batch = len(numbers)
        inputs = DenseInputs(
            ts_ms=np.full(batch, float(ts_ms)),
            uploaded_at=numbers[:, 0],
            duration_ms=numbers[:, 1],
            stats=stats_matrix(stats),
            history_len=np.full(batch, float(len(history))),
        )
        return dense_matrix(self.schema.dense, inputs)
