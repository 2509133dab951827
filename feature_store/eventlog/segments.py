"""On-disk form of the in-process event log (the embedded mode's durability).

Layout under the log's directory::

    meta.json                   partition count and layout version (checked on start)
    offsets.json                committed offsets {group: {partition: offset}}, atomic
    dead_letters.log            dead letters, length-prefixed
    p0000/00000000000000000000.seg   records of partition 0 from offset 0, ...

A segment is a run of length-prefixed records, named by the offset of its
first record (zero-padded, so names sort by offset). Writes are flushed to the
OS after every produce but not fsynced: a process crash loses nothing, a
machine crash may lose the last moments, which the embedded mode accepts
(Kafka is the durable choice). A torn record at the end of a segment (a crash
mid-write) is cut off on load. Retention deletes whole segments.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from feature_store.atomic import atomic_binary, atomic_json
from feature_store.errors import ConfigurationError, EventLogUnavailable

_RECORD = struct.Struct(">qqii")
"""Record header: offset, log timestamp (ms), key length (-1: no key), value length."""
_DEAD = struct.Struct(">iiii")
"""Dead-letter header: reason, source, key (-1: none) and value lengths."""
_SEGMENT_SUFFIX = ".seg"


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record as the log holds it: encoded bytes plus where and when."""

    offset: int
    ts: int
    """Time the log stored it, ms since epoch (non-decreasing within a partition)."""
    key: bytes | None
    value: bytes


def read_json(path: Path) -> object | None:
    """The JSON in ``path``, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def check_meta(directory: Path, partitions: int) -> None:
    """Record the partition count on first use; refuse to reopen with another.

    The partition of a user is ``hash(user_id) % partitions``: changing the
    count would scatter users' histories over partitions and break ordering.
    """
    path = directory / "meta.json"
    meta = read_json(path)
    if meta is None:
        atomic_json(path, {"partitions": partitions, "format": 1}, sort_keys=True)
        return
    if not isinstance(meta, dict) or meta.get("partitions") != partitions:
        found = meta.get("partitions") if isinstance(meta, dict) else meta
        raise ConfigurationError(
            f"event_log.memory_partitions: {directory} holds a log with {found} partitions, "
            f"settings ask for {partitions}; keep the count or move the directory away"
        )


def _read_exact(handle: BinaryIO, size: int) -> bytes | None:
    data = handle.read(size)
    return data if len(data) == size else None


class PartitionFiles:
    """Append-only segment files of one partition."""

    def __init__(self, directory: Path, segment_records: int) -> None:
        self.directory = directory
        self.segment_records = segment_records
        """Records per segment file; retention frees disk a segment at a time."""
        self._segments: list[int] = []
        """Base offsets of the segment files, ascending."""
        self._handle: BinaryIO | None = None
        self._in_current = 0

    def load(self) -> Iterator[StoredRecord]:
        """Every stored record in offset order; cuts a torn tail off the last segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segments = sorted(
            int(path.stem) for path in self.directory.glob(f"*{_SEGMENT_SUFFIX}")
        )
        for index, base in enumerate(self._segments):
            is_last = index == len(self._segments) - 1
            count = 0
            for record in self._read_segment(base, truncate_torn=is_last):
                count += 1
                yield record
            if is_last:
                self._in_current = count

    def _path(self, base: int) -> Path:
        return self.directory / f"{base:020d}{_SEGMENT_SUFFIX}"

    def _read_segment(self, base: int, truncate_torn: bool) -> Iterator[StoredRecord]:
        path = self._path(base)
        good_end = 0
        with open(path, "rb") as handle:
            while True:
                header = _read_exact(handle, _RECORD.size)
                if header is None:
                    break
                offset, ts, key_len, value_len = _RECORD.unpack(header)
                key = None if key_len < 0 else _read_exact(handle, key_len)
                value = _read_exact(handle, value_len)
                if value is None or (key_len >= 0 and key is None):
                    break
                good_end = handle.tell()
                yield StoredRecord(offset, ts, key, value)
            torn = handle.tell() != good_end
        if torn and truncate_torn:
            with open(path, "r+b") as handle:
                handle.truncate(good_end)

    def end_offset(self, loaded_end: int) -> int:
        """Next offset: from the records read, or an empty segment's name."""
        if self._segments and self._in_current == 0:
            return max(loaded_end, self._segments[-1])
        return loaded_end

    def append(self, records: Iterable[StoredRecord]) -> None:
        """Append records (in offset order) and flush them to the OS."""
        try:
            for record in records:
                if self._handle is None or self._in_current >= self.segment_records:
                    self._open_segment(record.offset)
                assert self._handle is not None
                key_len = -1 if record.key is None else len(record.key)
                self._handle.write(
                    _RECORD.pack(record.offset, record.ts, key_len, len(record.value))
                )
                if record.key is not None:
                    self._handle.write(record.key)
                self._handle.write(record.value)
                self._in_current += 1
            if self._handle is not None:
                self._handle.flush()
        except OSError as exc:
            raise EventLogUnavailable(
                f"cannot write the event log in {self.directory}: {exc}"
            ) from exc

    def _open_segment(self, base: int) -> None:
        """Continue the last segment while it has room (after a load), else start ``base``."""
        if self._handle is not None:
            self._handle.close()
        if not self._segments or self._in_current >= self.segment_records:
            self._segments.append(base)
            self._in_current = 0
        self._handle = open(self._path(self._segments[-1]), "ab")  # noqa: SIM115

    def drop_before(self, offset: int) -> None:
        """Delete segments whose every record lies before ``offset`` (retention)."""
        while len(self._segments) > 1 and self._segments[1] <= offset:
            base = self._segments.pop(0)
            self._path(base).unlink(missing_ok=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    reason: str
    source: str
    key: bytes | None
    value: bytes
    group: str = ""
    """Consumer group that met the record; stored after the source, behind a NUL
    (files written before groups were named read back with ``""``)."""


def _pack_dead(letter: StoredDeadLetter) -> bytes:
    reason = letter.reason.encode()
    source = (f"{letter.source}\0{letter.group}" if letter.group else letter.source).encode()
    key_len = -1 if letter.key is None else len(letter.key)
    return b"".join(
        (
            _DEAD.pack(len(reason), len(source), key_len, len(letter.value)),
            reason,
            source,
            letter.key or b"",
            letter.value,
        )
    )


class DeadLetterFile:
    """The dead letters of the in-process log, appended as they happen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: BinaryIO | None = None

    def load(self) -> list[StoredDeadLetter]:
        """Every stored dead letter; a torn tail (crash mid-write) is cut off."""
        letters: list[StoredDeadLetter] = []
        try:
            handle = open(self.path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return letters
        with handle:
            good_end = 0
            while (header := _read_exact(handle, _DEAD.size)) is not None:
                reason_len, source_len, key_len, value_len = _DEAD.unpack(header)
                body = _read_exact(handle, reason_len + source_len + max(key_len, 0) + value_len)
                if body is None:
                    break
                good_end = handle.tell()
                reason = body[:reason_len].decode()
                stored = body[reason_len : reason_len + source_len].decode()
                source, _, group = stored.partition("\0")
                at = reason_len + source_len
                key = None if key_len < 0 else body[at : at + key_len]
                value = body[at + max(key_len, 0) :]
                letters.append(StoredDeadLetter(reason, source, key, value, group))
            torn = handle.seek(0, os.SEEK_END) != good_end
        if torn:
            self.rewrite(letters)  # later appends must not follow half a record
        return letters

    def append(self, letters: Iterable[StoredDeadLetter]) -> None:
        try:
            if self._handle is None:
                self._handle = open(self.path, "ab")  # noqa: SIM115
            for letter in letters:
                self._handle.write(_pack_dead(letter))
            self._handle.flush()
        except OSError as exc:
            raise EventLogUnavailable(f"cannot write dead letters to {self.path}: {exc}") from exc

    def rewrite(self, letters: Iterable[StoredDeadLetter]) -> None:
        """Replace the file with ``letters`` (after retention trimmed the list)."""
        self.close()
        with atomic_binary(self.path) as handle:
            for letter in letters:
                handle.write(_pack_dead(letter))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
