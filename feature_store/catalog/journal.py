"""The embedded catalog's write-ahead journal: every acknowledged write survives kill -9.

The embedded catalog used to be written to disk only by the snapshot at a
clean shutdown, so a video added (or hidden) through the API was gone after
a crash, and a hidden video became recommendable again. Now every write is
appended here, one :class:`~feature_store.catalog.base.Video` as JSON per
line (the whole record after the change, so replaying a line twice is
harmless), and fsynced **before** the write is applied and answered.

A snapshot rotates the journal: under the catalog's lock the current file
is renamed to :data:`ROTATED_FILE` and a new one started; once the snapshot
is durable the rotated file is deleted. A restore reads the snapshot, then
the rotated journal, then the current one; a line torn by a crash mid-append
(never acknowledged) is skipped.

Cost: one ``write`` + ``fsync`` per upsert batch or hide (a few ms on a
disk, well under a ms on SSDs); catalog writes are rare next to events.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from feature_store.catalog.base import Video
from feature_store.errors import StoreUnavailable

log = logging.getLogger(__name__)

JOURNAL_FILE = "journal.jsonl"
ROTATED_FILE = "journal.rotated.jsonl"
"""The journal being folded into a snapshot (deleted once the snapshot is durable)."""


class CatalogJournal:
    """Append-only, fsynced record of catalog writes in ``directory``; not thread-safe
    (the catalog calls it under its lock)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / JOURNAL_FILE
        self._handle: TextIO | None = None

    def append(self, videos: Sequence[Video]) -> None:
        """Write and fsync ``videos``; raises :class:`StoreUnavailable` if the disk refuses."""
        text = "".join(video.model_dump_json() + "\n" for video in videos)
        try:
            if self._handle is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._handle.write(text)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise StoreUnavailable(f"catalog journal {self.path}: {exc}") from exc

    def rotate(self) -> None:
        """Start a new file; the old one is kept as :data:`ROTATED_FILE` until
        :meth:`drop_rotated` (added to it when an earlier rotation is still there)."""
        self.close()
        if not self.path.exists():
            return
        rotated = self.directory / ROTATED_FILE
        if rotated.exists():
            with open(rotated, "a", encoding="utf-8") as out:
                out.write(self.path.read_text(encoding="utf-8"))
                out.flush()
                os.fsync(out.fileno())
            self.path.unlink()
        else:
            os.replace(self.path, rotated)

    def drop_rotated(self) -> None:
        (self.directory / ROTATED_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def has_journal(directory: Path) -> bool:
    return any((directory / name).is_file() for name in (ROTATED_FILE, JOURNAL_FILE))


def read_journals(directory: Path) -> Iterator[Video]:
    """The records of the rotated journal, then the current one, oldest first."""
    for name in (ROTATED_FILE, JOURNAL_FILE):
        path = directory / name
        if not path.is_file():
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.endswith("\n"):
                    break  # torn by a crash mid-append: never acknowledged
                try:
                    yield Video.model_validate(json.loads(line))
                except ValueError as exc:  # a damaged line; the ones after it still apply
                    log.warning("catalog journal %s: skipped a damaged line: %s", path, exc)
