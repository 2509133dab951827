"""In-process candidate signals for the embedded single process (and tests).

Dicts under one lock. ``trending`` re-sorts at most every ``top_cache_ms``
(sorting 100k videos per request would cost milliseconds), which bounds how
stale the trending list can be well inside the 2 s freshness goal.
Snapshots are one JSON file written atomically, driven by the owner.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from feature_store.activity.base import HistoryEntry
from feature_store.atomic import atomic_json
from feature_store.catalog.base import Video
from feature_store.events import Event
from feature_store.signals.base import (
    RESCALE_EXPONENT,
    SignalParams,
    cosine_scores,
    covisit_increments,
    interleave,
    seed_weights,
    trending_increments,
)

SNAPSHOT_FILE = "signals.json"
_TOP_KEEP = 1000


class MemorySignals:
    """:class:`~feature_store.signals.base.CandidateSignals` held in dicts."""

    def __init__(
        self, params: SignalParams, top_cache_ms: float = 250.0, snapshot_dir: Path | None = None
    ) -> None:
        self.params = params
        self.snapshot_dir = snapshot_dir
        """Where :meth:`close` snapshots (the embedded data directory); None: nowhere."""
        self.top_cache_ms = top_cache_ms
        self._lock = threading.Lock()
        self._landmark_ms: int | None = None
        self._trend: dict[str, float] = defaultdict(float)
        self._covis: dict[str, dict[str, float]] = defaultdict(dict)
        self._visits: dict[str, float] = {}
        self._creators: dict[str, dict[str, int]] = defaultdict(dict)
        self._category_of: dict[str, str] = {}
        self._category_trend: dict[str, dict[str, float]] = defaultdict(dict)
        self._top: list[tuple[str, float]] = []
        self._top_at = 0.0

    # --- writes ------------------------------------------------------------

    def record(
        self,
        events: Sequence[Event],
        histories: Mapping[str, Sequence[HistoryEntry]] | None = None,
    ) -> None:
        if not events:
            return
        covisits = covisit_increments(events, histories, self.params.window)
        with self._lock:
            if self._landmark_ms is None:
                self._landmark_ms = min(e.ts for e in events)
            self._maybe_rescale(max(e.ts for e in events))
            cap = self.params.category_videos
            for video, inc in trending_increments(
                events, self._landmark_ms, self.params.half_life_s
            ).items():
                self._trend[video] += inc
                category = self._category_of.get(video)
                if category is not None:
                    scores = self._category_trend[category]
                    scores[video] = scores.get(video, 0.0) + inc
                    if len(scores) > 2 * cap:
                        self._category_trend[category] = dict(
                            heapq.nlargest(cap, scores.items(), key=_score)
                        )
            for video, count in covisits.visits.items():
                self._visits[video] = self._visits.get(video, 0.0) + count
            touched = set()
            for (a, b), weight in covisits.pairs.items():
                row = self._covis[a]
                row[b] = row.get(b, 0.0) + weight
                touched.add(a)
            for video in touched:
                row = self._covis[video]
                if len(row) > 2 * self.params.neighbors:
                    keep = heapq.nlargest(self.params.neighbors, row.items(), key=_score)
                    self._covis[video] = dict(keep)
            self._top_at = 0.0

    def _maybe_rescale(self, ts_ms: int) -> None:
        assert self._landmark_ms is not None
        half_life_ms = self.params.half_life_s * 1000.0
        exponent = (ts_ms - self._landmark_ms) / half_life_ms
        if exponent > RESCALE_EXPONENT:
            shift = int(exponent)
            factor = 2.0**-shift
            for video in self._trend:
                self._trend[video] *= factor
            for scores in self._category_trend.values():
                for video in scores:
                    scores[video] *= factor
            self._landmark_ms += int(shift * half_life_ms)

    def index_videos(self, videos: Sequence[Video]) -> None:
        cap = self.params.creator_videos
        with self._lock:
            for video in videos:
                uploads = self._creators[video.creator_id]
                before = self._category_of.pop(video.video_id, None)
                if before is not None and before != video.category or video.hidden:
                    self._category_trend.get(before or "", {}).pop(video.video_id, None)
                if video.hidden:
                    uploads.pop(video.video_id, None)
                    continue
                self._category_of[video.video_id] = video.category
                uploads[video.video_id] = video.uploaded_at
                if len(uploads) > 2 * cap:
                    keep = heapq.nlargest(cap, uploads.items(), key=_score)
                    self._creators[video.creator_id] = dict(keep)

    # --- reads -------------------------------------------------------------

    def trending(self, limit: int) -> list[tuple[str, float]]:
        now = time.monotonic() * 1000
        if now - self._top_at > self.top_cache_ms:
            with self._lock:
                top = heapq.nlargest(_TOP_KEEP, self._trend.items(), key=_score)
                self._top, self._top_at = _normalised(top), now
        return self._top[:limit]

    def covisited(
        self, video_ids: Sequence[str], limit: int | None
    ) -> list[tuple[str, float]]:
        seeds = seed_weights(video_ids, self.params.decay)
        with self._lock:
            partners = {video: self._covis[video] for video in seeds if video in self._covis}
            return cosine_scores(partners, seeds, self._visits, limit)

    def creator_videos(self, creator_ids: Sequence[str], limit: int) -> list[str]:
        with self._lock:
            lists = [
                [v for v, _ in sorted(self._creators.get(c, {}).items(), key=_score, reverse=True)]
                for c in creator_ids
            ]
        return interleave(lists, limit)

    def category_videos(self, categories: Sequence[str], limit: int) -> list[str]:
        with self._lock:
            lists = [
                [v for v, _ in heapq.nlargest(limit, self._category_trend.get(c, {}).items(),
                                              key=_score)]
                for c in categories
            ]
        return interleave(lists, limit)

    def ping(self) -> None:
        return None

    # --- persistence -------------------------------------------------------

    def snapshot(self, directory: Path) -> None:
        with self._lock:
            data = {
                "landmark_ms": self._landmark_ms,
                "trend": dict(self._trend),
                "covis": {k: dict(v) for k, v in self._covis.items()},
                "visits": dict(self._visits),
                "creators": {k: dict(v) for k, v in self._creators.items()},
                "category_trend": {k: dict(v) for k, v in self._category_trend.items()},
            }
        directory.mkdir(parents=True, exist_ok=True)
        atomic_json(directory / SNAPSHOT_FILE, data)

    def restore(self, directory: Path) -> None:
        path = directory / SNAPSHOT_FILE
        if not path.is_file():
            return
        data = json.loads(path.read_text(encoding="utf-8"))
        with self._lock:
            self._landmark_ms = data.get("landmark_ms")
            self._trend = defaultdict(float, data.get("trend", {}))
            self._covis = defaultdict(dict, data.get("covis", {}))
            self._visits = dict(data.get("visits", {}))
            self._creators = defaultdict(dict, data.get("creators", {}))
            self._category_trend = defaultdict(dict, data.get("category_trend", {}))
            self._top_at = 0.0

    def close(self) -> None:
        if self.snapshot_dir is not None:
            self.snapshot(self.snapshot_dir)


def _score(item: tuple[str, float]) -> float:
    return item[1]


def _normalised(items: list[tuple[str, float]]) -> list[tuple[str, float]]:
    if not items or items[0][1] <= 0:
        return items
    top = items[0][1]
    return [(video, score / top) for video, score in items]
