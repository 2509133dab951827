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
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features.columns import CATEGORICAL_SOURCES, MULTI_SOURCES, FeatureRow
from feature_store.features.extract import BatchFeatures, FeatureExtractor
from feature_store.features.keys import Keys
from feature_store.features.schema import FeatureSchema

REQUEST_CATEGORICAL = {"user_id", "device", "os", "country", "surface", "hour_of_day", "position_bucket"}
"""Categorical sources that depend only on the user, the context and the clock."""
VIDEO_CATEGORICAL = {"video_id", "creator_id", "category", "duration_bucket"}
"""Categorical sources that depend only on the catalog record."""
REQUEST_MULTI = {"history_videos"}
VIDEO_MULTI = {"tags"}
VECTOR_DENSE = {
    "video_age_log_hours",
    "duration_log_s",
    "log_engagements",
    "log_impressions",
    "finish_rate",
    "like_rate",
    "skip_rate",
    "history_length_log",
    "recency_log_hours",
}

_STAT_FIELDS = (
    "impressions", "plays", "finishes", "likes", "shares", "skips", "dislikes", "last_ts"
)
_stat_row = attrgetter(*_STAT_FIELDS)
_CACHE_MAX = 200_000


@dataclass
class _VideoKeys:
    """Hashed keys of one catalog record's video-level columns."""

    video: Video
    categorical: tuple[int, ...]
    """Keys of the video-level categorical columns, in schema order."""
    multi: dict[str, Keys]
    numbers: tuple[int, int]
    """``(uploaded_at, duration_ms)`` for the dense columns."""


class RequestFeatureExtractor(FeatureExtractor):
    """Builds :class:`BatchFeatures` for (one user) x (many videos). One per thread."""

    def __init__(self, schema: FeatureSchema) -> None:
        super().__init__(schema)
        self.vectorised = (
            all(c.source in REQUEST_CATEGORICAL | VIDEO_CATEGORICAL for c in schema.categorical)
            and all(c.source in REQUEST_MULTI | VIDEO_MULTI for c in schema.multi_valued)
            and all(c.source in VECTOR_DENSE for c in schema.dense)
        )
        self._video_cache: dict[str, _VideoKeys] = {}
        self._video_columns = [c.name for c in schema.categorical if c.source in VIDEO_CATEGORICAL]

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
        cached = [self._keys_of(v) for v in videos]
        raw: dict[str, Keys] = {}
        lengths: dict[str, npt.NDArray[np.int64]] = {}
        if self._video_columns:
            matrix = np.array([c.categorical for c in cached], dtype=np.uint64)
            matrix = matrix.reshape(batch, len(self._video_columns))
            for j, name in enumerate(self._video_columns):
                raw[name] = matrix[:, j]
        for col in self.schema.categorical:
            if col.source in REQUEST_CATEGORICAL:
                value = CATEGORICAL_SOURCES[col.source](template)
                key = self._hasher(col.space()).hash_many([value])[0]
                raw[col.name] = np.full(batch, key, dtype=np.uint64)
        for multi in self.schema.multi_valued:
            if multi.source in REQUEST_MULTI:
                values = MULTI_SOURCES[multi.source](template)[: multi.max_len]
                keys = self._hasher(multi.space()).hash_many(values)
                raw[multi.name] = np.tile(keys, batch)
                lengths[multi.name] = np.full(batch, len(values), dtype=np.int64)
            else:
                parts = [c.multi[multi.name] for c in cached]
                lengths[multi.name] = np.fromiter(map(len, parts), np.int64, batch)
                raw[multi.name] = (
                    np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
                )
        table_keys, column_indices = self._index_tables(batch, raw, lengths)
        wide_keys, wide_indices = self._index_wide(batch, raw)
        numbers = np.array([c.numbers for c in cached], dtype=np.float64).reshape(batch, 2)
        dense = self._dense(ts_ms, history, numbers, stats)
        return BatchFeatures(batch, table_keys, column_indices, wide_keys, wide_indices, dense)

    def _keys_of(self, video: Video) -> _VideoKeys:
        entry = self._video_cache.get(video.video_id)
        if entry is not None and (entry.video is video or entry.video == video):
            return entry
        row = FeatureRow("", video.video_id, 0, video)
        categorical = tuple(
            int(self._hasher(c.space()).hash_many([CATEGORICAL_SOURCES[c.source](row)])[0])
            for c in self.schema.categorical
            if c.source in VIDEO_CATEGORICAL
        )
        multi = {
            c.name: self._hasher(c.space()).hash_many(MULTI_SOURCES[c.source](row)[: c.max_len])
            for c in self.schema.multi_valued
            if c.source in VIDEO_MULTI
        }
        if len(self._video_cache) >= _CACHE_MAX:
            self._video_cache.clear()
        entry = self._video_cache[video.video_id] = _VideoKeys(
            video, categorical, multi, (video.uploaded_at, video.duration_ms)
        )
        return entry

    def _dense(
        self,
        ts_ms: int,
        history: Sequence[HistoryEntry],
        numbers: npt.NDArray[np.float64],
        stats: Sequence[VideoStats],
    ) -> npt.NDArray[np.float32]:
        batch = len(numbers)
        uploaded, duration = numbers[:, 0], numbers[:, 1]
        table = np.array(list(map(_stat_row, stats)), dtype=np.float64)
        table = table.reshape(batch, len(_STAT_FIELDS))
        s = {name: table[:, j] for j, name in enumerate(_STAT_FIELDS)}
        engagements = s["plays"] + s["finishes"] + s["likes"] + s["shares"]
        hours = np.maximum(0.0, (ts_ms - s["last_ts"]) / 3_600_000)
        values = {
            "video_age_log_hours": lambda: np.log1p(np.maximum(0.0, (ts_ms - uploaded) / 3_600_000)),
            "duration_log_s": lambda: np.log1p(duration / 1000),
            "log_engagements": lambda: np.log1p(engagements),
            "log_impressions": lambda: np.log1p(s["impressions"]),
            "finish_rate": lambda: (s["finishes"] + 0.5) / (s["plays"] + 1.0),
            "like_rate": lambda: (s["likes"] + s["shares"] + 0.1) / (s["plays"] + 1.0),
            "skip_rate": lambda: (s["skips"] + s["dislikes"] + 0.1)
            / (s["impressions"] + s["plays"] + 1.0),
            "history_length_log": lambda: np.full(batch, np.log1p(len(history))),
            "recency_log_hours": lambda: np.where(s["last_ts"] > 0, np.log1p(hours), 10.0),
        }
        out = np.empty((batch, len(self.schema.dense)), dtype=np.float32)
        for j, col in enumerate(self.schema.dense):
            out[:, j] = values[col.source]()
        return out
