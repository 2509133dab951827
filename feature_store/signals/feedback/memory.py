"""In-process per-user feedback for the embedded single process (and tests).

Dicts under one lock; bounds as :mod:`~feature_store.signals.feedback.base`
says: a user's served entries are trimmed to the window and to ``served_max``
at each write for that user, and users none of whose entries can still count
are swept when the number of users doubles. Snapshots are one JSON file
written atomically, driven by the owner (the signal feed, and :meth:`close`).
"""

from __future__ import annotations

import heapq
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from feature_store.atomic import atomic_json
from feature_store.events import Event
from feature_store.signals.feedback.base import (
    DISLIKE,
    ENGAGEMENTS,
    FeedbackParams,
    FeedbackView,
    ServedBatch,
    creator_changes,
)

SNAPSHOT_FILE = "feedback.json"

Stamps = dict[str, int]
"""Id -> time (ms)."""


def _newest(stamps: Stamps, keep: int) -> Stamps:
    """The ``keep`` newest of ``stamps`` (the dict itself when it is within bounds)."""
    if len(stamps) <= keep:
        return stamps
    return dict(heapq.nlargest(keep, stamps.items(), key=lambda item: item[1]))


class MemoryFeedback:
    """:class:`~feature_store.signals.feedback.base.UserFeedback` held in dicts."""

    def __init__(self, params: FeedbackParams, snapshot_dir: Path | None = None) -> None:
        self.params = params
        self.snapshot_dir = snapshot_dir
        """Where :meth:`close` snapshots (the embedded data directory); None: nowhere."""
        self._lock = threading.Lock()
        self._served: dict[str, Stamps] = {}
        self._disliked: dict[str, Stamps] = {}
        self._creators: dict[str, Stamps] = {}
        self._latest_ms = 0
        """Newest served time seen: what the sweep measures the window from."""
        self._sweep_at = 1024
        """Users with served entries at which the next sweep runs."""

    # --- writes ------------------------------------------------------------

    def record_served(self, batches: Sequence[ServedBatch]) -> None:
        window, keep = self.params.served_window_ms, self.params.served_max
        with self._lock:
            for user_id, ts_ms, video_ids in batches:
                stamps = self._served.setdefault(user_id, {})
                for video in video_ids:
                    if stamps.get(video, -1) < ts_ms:
                        stamps[video] = ts_ms
                oldest = ts_ms - window
                if min(stamps.values(), default=oldest) < oldest:
                    stamps = {v: t for v, t in stamps.items() if t >= oldest}
                self._served[user_id] = _newest(stamps, keep)
                self._latest_ms = max(self._latest_ms, ts_ms)
            if len(self._served) >= self._sweep_at:
                self._sweep()

    def _sweep(self) -> None:
        """Drop users whose every served entry is out of the window (lock held)."""
        oldest = self._latest_ms - self.params.served_window_ms
        self._served = {
            user: stamps
            for user, stamps in self._served.items()
            if stamps and max(stamps.values()) >= oldest
        }
        self._sweep_at = max(1024, 2 * len(self._served))

    def record_events(self, events: Sequence[Event], creators: Mapping[str, str]) -> None:
        keep = self.params.dislikes_max
        with self._lock:
            for event in events:
                if event.type in ENGAGEMENTS:
                    served = self._served.get(event.user_id)
                    if served:
                        served.pop(event.video_id, None)
                elif event.type is DISLIKE:
                    self._stamp(self._disliked, event.user_id, event.video_id, event.ts, keep)
            disliked, cleared = creator_changes(
                events, creators, self.params.positive_watch_ratio
            )
            for user_id, gone in cleared.items():
                stamps = self._creators.get(user_id, {})
                for creator in gone:
                    stamps.pop(creator, None)
            for user_id, by_creator in disliked.items():
                for creator, ts in by_creator.items():
                    self._stamp(self._creators, user_id, creator, ts, keep)

    @staticmethod
    def _stamp(table: dict[str, Stamps], user_id: str, key: str, ts: int, keep: int) -> None:
        stamps = table.setdefault(user_id, {})
        if stamps.get(key, -1) < ts:
            stamps[key] = ts
        if len(stamps) > keep:
            table[user_id] = _newest(stamps, keep)

    # --- reads -------------------------------------------------------------

    def read(self, user_id: str, now_ms: int) -> FeedbackView:
        oldest = now_ms - self.params.served_window_ms
        with self._lock:
            served = {v: t for v, t in self._served.get(user_id, {}).items() if t >= oldest}
            disliked = dict(self._disliked.get(user_id, {}))
            creators = dict(self._creators.get(user_id, {}))
        latest = max(disliked.values(), default=None)
        if latest is not None and latest + self.params.dislikes_ttl_ms < now_ms:
            disliked, creators = {}, {}  # expired, as Redis would have let them
        return FeedbackView(served, disliked, creators)

    def ping(self) -> None:
        return None

    # --- persistence -------------------------------------------------------

    def snapshot(self, directory: Path) -> None:
        with self._lock:
            data = {
                "served": {u: dict(s) for u, s in self._served.items()},
                "disliked": {u: dict(s) for u, s in self._disliked.items()},
                "creators": {u: dict(s) for u, s in self._creators.items()},
                "latest_ms": self._latest_ms,
            }
        directory.mkdir(parents=True, exist_ok=True)
        atomic_json(directory / SNAPSHOT_FILE, data)

    def restore(self, directory: Path) -> None:
        path = directory / SNAPSHOT_FILE
        if not path.is_file():
            return
        data = json.loads(path.read_text(encoding="utf-8"))
        with self._lock:
            self._served = {u: dict(s) for u, s in data.get("served", {}).items()}
            self._disliked = {u: dict(s) for u, s in data.get("disliked", {}).items()}
            self._creators = {u: dict(s) for u, s in data.get("creators", {}).items()}
            self._latest_ms = int(data.get("latest_ms", 0))

    def close(self) -> None:
        if self.snapshot_dir is not None:
            self.snapshot(self.snapshot_dir)
