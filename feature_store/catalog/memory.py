"""The embedded catalog: a dict in this process, snapshotted to disk as JSON lines.

Also home of the catalog's snapshot format (:func:`write_snapshot`,
:func:`read_snapshot`), which every backend writes and reads so that a
snapshot taken from one restores into another.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from feature_store.atomic import atomic_text
from feature_store.catalog.base import Video
from feature_store.catalog.journal import CatalogJournal, has_journal, read_journals
from feature_store.changelog import ChangeLog
from feature_store.errors import InvalidInput, NotFound

SNAPSHOT_FILE = "catalog.jsonl"
"""One :class:`Video` as JSON per line, in no particular order."""

_REBUILD_FRACTION = 8
"""An upsert touching more than 1/8 of the index re-sorts it instead of inserting one by one.

Single inserts into a sorted list cost a memmove of the list (a few ms at a
million videos); a bulk load (restore, seeding) is cheaper as one sort.
"""


def write_snapshot(directory: Path, videos: Iterable[Video]) -> None:
    """Write ``videos`` to ``directory/catalog.jsonl`` atomically.

    The lines go to a temporary file in the same directory, which is fsynced
    and then renamed over the old snapshot (and the directory fsynced), so a
    crash leaves either the old snapshot or the new one, never half of one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_text(directory / SNAPSHOT_FILE) as out:
        for video in videos:
            out.write(video.model_dump_json())
            out.write("\n")


def read_snapshot(directory: Path) -> Iterator[Video]:
    """Videos of the snapshot in ``directory``; raises :class:`NotFound` without one.

    A line that does not parse raises :class:`InvalidInput` naming its line
    number: a damaged snapshot should stop a restore, not shrink the catalog.
    """
    path = directory / SNAPSHOT_FILE
    if not path.is_file():
        raise NotFound(f"no catalog snapshot at {path}")
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield Video.model_validate_json(line)
            except ValueError as exc:
                raise InvalidInput(f"{path.name}:{number}", str(exc)) from exc


class MemoryCatalog:
    """Catalog held in a dict, for the embedded single process and for tests.

    ``recent`` reads a list of ``(uploaded_at, video_id)`` kept sorted with
    :mod:`bisect`, holding only visible videos, so it costs O(limit) and hiding
    a video is one removal. Ties in ``uploaded_at`` come out by descending
    ``video_id``, exactly as Redis orders equal scores, so both backends
    answer identically.

    One lock guards every write and every read that spans the dict and the
    index; ``get`` and ``get_many`` are single dict lookups, atomic under the
    GIL, and take no lock. Critical sections are dict updates and list
    slices, far too short for contention to be worth a finer scheme.

    Every write appends the ids it changed to :attr:`changes`, which
    serving's per-video arrays follow (:mod:`feature_store.changelog`).

    Persistence is driven by the owner (``Resources.snapshot`` / ``restore``
    in :mod:`feature_store.runtime.resources`), not by :meth:`close`, so a snapshot is
    written once per shutdown. Given a ``journal_dir`` (the embedded data
    directory's ``catalog/``), every write is also fsynced to a journal
    before it is applied (:mod:`feature_store.catalog.journal`), so what an
    API call was told is written survives a kill -9; :meth:`restore` replays
    the journal after the snapshot.
    """

    def __init__(self, journal_dir: Path | None = None) -> None:
        self._journal = None if journal_dir is None else CatalogJournal(journal_dir)
        self._videos: dict[str, Video] = {}
        self._visible: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self.changes = ChangeLog()
        """Ids of the videos written (upserted, hidden, unhidden), in order."""

    def __enter__(self) -> MemoryCatalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- writes ------------------------------------------------------------

    def upsert(self, videos: Sequence[Video]) -> None:
        """Insert or replace videos (keeps nothing of a replaced record)."""
        with self._lock:
            if self._journal is not None:
                self._journal.append(videos)  # durable before it is visible or answered
            if len(videos) * _REBUILD_FRACTION > len(self._visible):
                self._videos.update((video.video_id, video) for video in videos)
                self._rebuild_index()
            else:
                for video in videos:
                    old = self._videos.get(video.video_id)
                    if old is not None:
                        self._unindex(old)
                    self._videos[video.video_id] = video
                    if not video.hidden:
                        insort(self._visible, (video.uploaded_at, video.video_id))
            # After the writes: a reader that sees an id here reads the new record.
            self.changes.append(video.video_id for video in videos)

    def set_hidden(self, video_id: str, hidden: bool) -> Video:
        """Hide or unhide; raises :class:`NotFound` for an unknown id."""
        with self._lock:
            old = self._videos.get(video_id)
            if old is None:
                raise NotFound(f"video {video_id!r} is not in the catalog")
            if old.hidden == hidden:
                return old
            new = old.model_copy(update={"hidden": hidden})
            if self._journal is not None:
                self._journal.append([new])
            self._videos[video_id] = new
            self.changes.append((video_id,))
            if hidden:
                self._unindex(old)
            else:
                insort(self._visible, (new.uploaded_at, video_id))
            return new

    def _unindex(self, video: Video) -> None:
        if video.hidden:
            return
        entry = (video.uploaded_at, video.video_id)
        at = bisect_left(self._visible, entry)
        if at < len(self._visible) and self._visible[at] == entry:
            del self._visible[at]

    def _rebuild_index(self) -> None:
        self._visible = sorted(
            (video.uploaded_at, video.video_id)
            for video in self._videos.values()
            if not video.hidden
        )

    # --- reads -------------------------------------------------------------

    def get(self, video_id: str) -> Video | None:
        return self._videos.get(video_id)

    def get_many(self, video_ids: Sequence[str]) -> list[Video | None]:
        """Videos in the order asked, ``None`` where unknown."""
        return list(map(self._videos.get, video_ids))  # C-level: 500 ids per request

    def recent(self, limit: int, since_ms: int | None = None) -> list[Video]:
        """Newest visible uploads first; only those uploaded at or after ``since_ms``."""
        if limit <= 0:
            return []
        with self._lock:
            index = self._visible
            low = 0 if since_ms is None else bisect_left(index, (since_ms, ""))
            start = max(low, len(index) - limit)
            return [self._videos[video_id] for _, video_id in reversed(index[start:])]

    def count(self) -> int:
        """Every video, hidden ones included."""
        return len(self._videos)

    def iter_all(self) -> Iterable[Video]:
        """Every video (hidden included) as of the call, in no particular order."""
        with self._lock:
            return list(self._videos.values())

    # --- persistence -------------------------------------------------------

    def snapshot(self, directory: Path) -> None:
        """Write every video to ``directory`` (atomically replaces an old snapshot).

        Only the copy of the values is taken under the lock (the journal is
        rotated in the same critical section, so each write is in the copy or
        in the new journal); serializing a million videos happens outside it
        so that serving is not stalled.
        """
        journal = self._journal if self._journal is not None and (
            self._journal.directory == directory
        ) else None
        with self._lock:
            videos = list(self._videos.values())
            if journal is not None:
                journal.rotate()
        write_snapshot(directory, videos)
        if journal is not None:
            journal.drop_rotated()

    def restore(self, directory: Path) -> int:
        """Replace the whole catalog with a snapshot from any backend, then the writes
        journalled after it (when ``directory`` holds a journal); returns its size."""
        videos: dict[str, Video] = {}
        if (directory / SNAPSHOT_FILE).is_file() or not has_journal(directory):
            videos = {video.video_id: video for video in read_snapshot(directory)}  # or NotFound
        for video in read_journals(directory):
            videos[video.video_id] = video
        with self._lock:
            self._videos = videos
            self._rebuild_index()
            self.changes.everything_changed()
        return len(videos)

    def close(self) -> None:
        """Close the journal; the owner snapshots first if it wants a compact copy."""
        if self._journal is not None:
            self._journal.close()
