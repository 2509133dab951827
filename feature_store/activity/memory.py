"""The embedded activity store: dicts in this process, snapshotted as JSON lines.

Also home of the activity snapshot format (:func:`write_snapshot`,
:func:`read_snapshot`), which every backend writes and reads so that a
snapshot taken from one restores into another. One line per user history
(``{"user_id": ..., "history": [[video_id, watch_ratio, ts, action, creator_id,
category], ...]}``, newest first; older three-element entries still read) or
per video's counters (``{"video_id": ..., "stats": {...}}``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from feature_store.activity import rules
from feature_store.activity.base import NO_STATS, HistoryEntry, VideoStats
from feature_store.atomic import atomic_text
from feature_store.catalog.base import Video
from feature_store.changelog import ChangeLog
from feature_store.errors import InvalidInput, NotFound
from feature_store.events import Event
from feature_store.features.dense import stats_matrix
from feature_store.settings import FeatureSettings

SNAPSHOT_FILE = "activity.jsonl"

History = tuple[HistoryEntry, ...]
"""A user's history, newest first; immutable so readers need no copy."""

Record = tuple[str, History | VideoStats]
"""A snapshot line decoded: ``(user_id, history)`` or ``(video_id, stats)``."""


def encode_entries(history: Iterable[HistoryEntry]) -> list[list[object]]:
    """Entries as compact ``[video_id, watch_ratio, ts, action, creator_id, category]``
    arrays (snapshot and Redis)."""
    return [
        [e.video_id, e.watch_ratio, e.ts, e.action, e.creator_id, e.category] for e in history
    ]


_FIELDS = ("video_id", "watch_ratio", "ts", "action", "creator_id", "category")


def decode_entry(values: Sequence[object]) -> HistoryEntry:
    """An entry from :func:`encode_entries`' array; the triples written before entries had
    an action (all positive watches) read as ``play`` with no creator or category."""
    return HistoryEntry(**dict(zip(_FIELDS, values, strict=False)))  # type: ignore[arg-type]


def write_snapshot(
    directory: Path,
    histories: Iterable[tuple[str, Sequence[HistoryEntry]]],
    stats: Iterable[tuple[str, VideoStats]],
) -> None:
    """Write histories and counters to ``directory/activity.jsonl`` atomically.

    Temporary file in the same directory, fsynced, renamed over the old one:
    a crash leaves the old snapshot or the new one, never a mix.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_text(directory / SNAPSHOT_FILE) as out:
        for user_id, history in histories:
            user = {"user_id": user_id, "history": encode_entries(history)}
            out.write(json.dumps(user, separators=(",", ":")) + "\n")
        for video_id, counters in stats:
            video = {"video_id": video_id, "stats": counters.model_dump()}
            out.write(json.dumps(video, separators=(",", ":")) + "\n")


def read_snapshot(directory: Path) -> Iterator[Record]:
    """Records of the snapshot in ``directory``; :class:`NotFound` without one.

    A damaged line raises :class:`InvalidInput` naming its line number.
    """
    path = directory / SNAPSHOT_FILE
    if not path.is_file():
        raise NotFound(f"no activity snapshot at {path}")
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if "user_id" in data:
                    history = tuple(decode_entry(triple) for triple in data["history"])
                    yield (str(data["user_id"]), history)
                else:
                    yield (str(data["video_id"]), VideoStats(**data["stats"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidInput(f"{path.name}:{number}", str(exc)) from exc


class MemoryActivity:
    """Histories and counters in dicts, for the embedded single process and tests.

    Histories are immutable tuples replaced whole on each update rather than
    deques mutated in place: :func:`rules.merge_history` rebuilds a history
    anyway (dedupe and ordering by ``ts`` are not deque operations), and a
    tuple can be handed to readers without copying under the lock. One lock
    serializes :meth:`record` and spans the multi-key reads; single lookups
    are atomic under the GIL. No expiry: the embedded store keeps every
    user's history (the Redis one expires idle ones).
    """

    def __init__(self, features: FeatureSettings) -> None:
        self.features = features
        self.rules = rules.history_rules(features)
        self._histories: dict[str, History] = {}
        self._stats: dict[str, VideoStats] = {}
        self._lock = threading.Lock()
        self.stats_changes = ChangeLog()
        """Ids of the videos whose counters changed, in order (serving's arrays follow it)."""

    def __enter__(self) -> MemoryActivity:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def record(
        self, events: Sequence[Event], videos: Mapping[str, Video | None] | None = None
    ) -> None:
        """Apply a batch of events per :mod:`feature_store.activity.rules`."""
        ordered = rules.in_order(events)
        deltas = rules.stats_deltas(ordered)
        catalog = videos or {}
        durations = rules.durations_of(catalog)
        with self._lock:
            for user_id, user_events in rules.by_user(ordered).items():
                old = self._histories.get(user_id, ())
                new = rules.merge_history(
                    old,
                    user_events,
                    videos=catalog,
                    rules=self.rules,
                    durations_ms=durations,
                )
                if new:
                    self._histories[user_id] = tuple(new)
            for video_id, delta in deltas.items():
                old_stats = self._stats.get(video_id) or NO_STATS
                self._stats[video_id] = rules.apply_delta(old_stats, delta)
            self.stats_changes.append(deltas)

    def history(self, user_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """Newest first; empty for an unknown user (and for ``limit <= 0``)."""
        if limit is not None and limit <= 0:
            return []
        return list(self._histories.get(user_id, ())[:limit])

    def histories(self, user_ids: Sequence[str]) -> list[list[HistoryEntry]]:
        """Several users' histories, in the order asked."""
        with self._lock:
            return [list(self._histories.get(user_id, ())) for user_id in user_ids]

    def video_stats(self, video_ids: Sequence[str]) -> list[VideoStats]:
        """Counters in the order asked; zeros for unknown videos."""
        with self._lock:
            # C-level map: 500 ids per recommend request.
            return list(map(self._stats.get, video_ids, repeat(NO_STATS, len(video_ids))))

    def video_stats_matrix(self, video_ids: Sequence[str]) -> npt.NDArray[np.float64]:
        return stats_matrix(self.video_stats(video_ids))

    def snapshot(self, directory: Path) -> None:
        """Write every history and counter to ``directory`` (atomic replace).

        Only the dict copies happen under the lock; values are immutable, so
        serializing runs outside it and ``record`` is not stalled.
        """
        with self._lock:
            histories = list(self._histories.items())
            stats = list(self._stats.items())
        write_snapshot(directory, histories, stats)

    def restore(self, directory: Path) -> None:
        """Replace everything with a snapshot from any backend.

        Histories longer than ``history_length`` (a snapshot taken under a
        larger setting) are cut to it.
        """
        histories: dict[str, History] = {}
        stats: dict[str, VideoStats] = {}
        length = self.features.history_length
        for key, value in read_snapshot(directory):
            if isinstance(value, VideoStats):
                stats[key] = value
            else:
                histories[key] = value[:length]
        with self._lock:
            self._histories = histories
            self._stats = stats
            self.stats_changes.everything_changed()

    def close(self) -> None:
        """Nothing to release; the owner snapshots first if it wants to keep the data."""
