"""The in-process event log: the embedded default, shaped like a Kafka topic.

Records are kept as encoded bytes with the time the log stored them, and
decoded on consume by the same stream codec (:mod:`feature_store.eventlog.codec`)
as the Kafka backend, so poisoned records behave identically. One shortcut,
because producer and consumers share the process: an item produced as an
object that passes the codec's checks at produce time (size and limits; the
limits only get easier with time) is also kept as that object for the newest
:data:`DECODED_WINDOW` records of its partition, and handed to consumers as
is instead of being decoded again (decoding was a fifth of the embedded
trainer's time per batch). The same class carries the served log
(:mod:`feature_store.eventlog.streams`). Consumer groups
split partitions among their live members (range assignment, rebalanced at
once when a member joins or leaves), commits are manual, and ``poll`` blocks
on a condition variable until records arrive or the timeout passes.

Given a directory, records go to per-partition segment files and committed
offsets to a JSON file (see :mod:`feature_store.eventlog.segments`), so a
restarted process resumes where it was. Without one, everything lives and
dies with the process (tests, throwaway runs).

One lock guards the whole log: the embedded mode serves one process, where
the cost of a lock is small next to decoding and training.

Where it differs from Kafka, on purpose: a member keeps its position in the
partitions it keeps across a rebalance (Kafka's eager protocol restarts them
from the last commit; both are at-least-once), and ``seek`` clamps an offset
into the held range (the Kafka backend clamps too, rather than let the broker
reset an out-of-range position to the beginning).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from feature_store.atomic import atomic_json
from feature_store.errors import Conflict, EventLogUnavailable
from feature_store.eventlog.base import (
    ConsumedEvent,
    DeadLetter,
    DeadRuns,
    Position,
    past_dead_letters,
)
from feature_store.eventlog.codec import BadRecord, partition_for, source_of
from feature_store.eventlog.segments import (
    DeadLetterFile,
    PartitionFiles,
    StoredDeadLetter,
    StoredRecord,
    check_meta,
    read_json,
)
from feature_store.eventlog.streams import StreamSpec, stream_spec
from feature_store.runtime import tracing
from feature_store.settings import Settings


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


DECODED_WINDOW = 16_384
"""Newest records per partition whose produced object is kept (about 1 KB an event), once
the partition has been read in this process."""


class _Partition:
    """Records of one partition, oldest first, with their offsets and times.

    Retention trims in chunks of 1/16 of ``retention`` so that dropping the
    head of the list (a memmove) is amortized: a partition holds between
    ``retention`` and ``retention * 17/16`` records once full.

    Records are kept as parallel lists of keys, values and times (bytes and
    ints, which the garbage collector does not track), not as
    :class:`StoredRecord` objects, which it does: a serving process's logs
    held tens of thousands, and every full collection walked them all while
    holding the GIL (59 ms at the overload benchmark's size, a stall of
    liveness and refusals; ``docs/benchmarks.md``, *Overload*). For the same
    reason a served log keeps its produced objects (``decoded``) only once
    something in this process reads the partition: one that only the trainer's
    process reads keeps none.
    """

    def __init__(self, retention: int, files: PartitionFiles | None, keep: bool = True) -> None:
        self.retention = retention
        self.files = files
        self.keys: list[bytes | None] = []
        self.values: list[bytes] = []
        self.decoded: list[Any] = []
        """Per record, the produced event when kept (see the module docstring)."""
        self.keep_decoded = keep
        """Whether produced objects are kept: from the start (``keep``: the events, which
        an in-process trainer or signal feed reads in every memory-backed topology, and
        may find as a backlog) or once a consumer in this process has read the partition
        (the served log)."""
        self.timestamps: list[int] = []
        """Log times of ``records``, non-decreasing, for binary search by time."""
        self.traces: dict[int, list[tuple[str, bytes]]] = {}
        """Headers by offset, of records produced inside a trace (tracing on): kept in
        memory only, trimmed with the records."""
        self.start = 0
        """Offset of ``records[0]`` (the log start once retention trimmed)."""
        self.end = 0
        """Offset the next record gets."""

    def load(self) -> None:
        if self.files is None:
            return
        for record in self.files.load():
            if not self.keys:
                self.start = record.offset
            self.keys.append(record.key)
            self.values.append(record.value)
            self.decoded.append(None)
            self.timestamps.append(record.ts)
            self.end = record.offset + 1
            if len(self.keys) >= self.retention + self._chunk:
                self._trim(persist=False)
        self.end = self.files.end_offset(self.end)
        self._trim(persist=False)
        if not self.keys:
            self.start = self.end
        self.files.drop_before(self.start)

    @property
    def _chunk(self) -> int:
        return max(1, self.retention // 16)

    def append(
        self,
        key: bytes | None,
        value: bytes,
        now_ms: int,
        event: Any = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> StoredRecord:
        last = self.timestamps[-1] if self.timestamps else 0
        record = StoredRecord(self.end, max(now_ms, last), key, value)
        if headers:
            self.traces[self.end] = headers
        self.keys.append(key)
        self.values.append(value)
        self.decoded.append(event if self.keep_decoded else None)
        if len(self.decoded) > DECODED_WINDOW:
            self.decoded[-DECODED_WINDOW - 1] = None  # bounded: old ones decode again
        self.timestamps.append(record.ts)
        self.end += 1
        return record

    def maybe_trim(self) -> None:
        if len(self.keys) >= self.retention + self._chunk:
            self._trim(persist=True)

    def _trim(self, persist: bool) -> None:
        drop = len(self.keys) - self.retention
        if drop <= 0:
            return
        del self.keys[:drop]
        del self.values[:drop]
        del self.decoded[:drop]
        del self.timestamps[:drop]
        self.start = self.start + drop if self.keys else self.end
        traces = self.traces
        while traces and next(iter(traces)) < self.start:  # offsets in insertion order
            del traces[next(iter(traces))]
        if persist and self.files is not None:
            self.files.drop_before(self.start)

    def read(self, offset: int, limit: int) -> tuple[list[StoredRecord], list[Any]]:
        """Records from ``offset`` and, per record, its kept event (or None)."""
        self.keep_decoded = True
        index = max(offset, self.start) - self.start
        end = min(index + limit, len(self.keys))
        records = [
            StoredRecord(self.start + i, self.timestamps[i], self.keys[i], self.values[i])
            for i in range(index, end)
        ]
        return records, self.decoded[index:end]

    def offset_for_time(self, ts_ms: int) -> int:
        """First offset stored at or after ``ts_ms``; ``end`` when none is."""
        return self.start + bisect.bisect_left(self.timestamps, ts_ms)

    def clamp(self, offset: int) -> int:
        return min(max(offset, self.start), self.end)


@dataclass
class _Group:
    members: list[MemoryEventConsumer] = field(default_factory=list)
    """Live members in join order (range assignment follows it)."""
    committed: dict[int, int] = field(default_factory=dict)


class MemoryEventLog:
    """In-process, thread-safe event log; pass ``directory`` to persist it.

    ``settings.event_log.memory_partitions`` partitions; a user's partition is
    the xxh64 of their ``user_id`` modulo that count, stable across restarts
    (a changed count is refused on reopen).
    """

    def __init__(
        self, settings: Settings, directory: Path | None = None, stream: StreamSpec | None = None
    ) -> None:
        config = settings.event_log
        stream = stream or stream_spec(settings, "events")
        self.stream = stream
        self.topic = stream.topic
        self.directory = directory
        self._codec = stream.codec
        self._retention = stream.memory_retention_records
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        """Notified when records arrive, assignments change, or the log closes."""
        segment_records = max(1, self._retention // 8)
        self._partitions = [
            _Partition(
                self._retention,
                None
                if directory is None
                else PartitionFiles(directory / f"p{index:04d}", segment_records),
                keep=stream.name == "events",
            )
            for index in range(config.memory_partitions)
        ]
        self._groups: dict[str, _Group] = {}
        self._dead: list[StoredDeadLetter] = []
        self._dead_file = (
            None if directory is None else DeadLetterFile(directory / "dead_letters.log")
        )
        self._started = False
        self._closed = False

    # --- lifecycle -------------------------------------------------------

    def start(self) -> MemoryEventLog:
        """Load the persisted log, if any. Idempotent."""
        with self._lock:
            if self._started:
                return self
            if self.directory is not None:
                self.directory.mkdir(parents=True, exist_ok=True)
                check_meta(self.directory, len(self._partitions))
                for partition in self._partitions:
                    partition.load()
                self._load_offsets()
                if self._dead_file is not None:
                    self._dead = self._dead_file.load()[-self._retention :]
            self._started = True
            return self

    def _load_offsets(self) -> None:
        assert self.directory is not None
        data = read_json(self.directory / "offsets.json")
        if not isinstance(data, dict):
            return
        for group_id, offsets in data.items():
            group = self._groups.setdefault(group_id, _Group())
            group.committed = {int(p): int(o) for p, o in offsets.items()}

    def _save_offsets(self) -> None:
        if self.directory is None:
            return
        data = {
            group_id: {str(p): o for p, o in sorted(group.committed.items())}
            for group_id, group in self._groups.items()
            if group.committed
        }
        try:
            atomic_json(self.directory / "offsets.json", data, sort_keys=True)
        except OSError as exc:
            raise EventLogUnavailable(f"cannot write committed offsets: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for group in self._groups.values():
                for member in list(group.members):
                    member._closed = True
                group.members.clear()
            for partition in self._partitions:
                if partition.files is not None:
                    partition.files.close()
            if self._dead_file is not None:
                self._dead_file.close()
            self._changed.notify_all()

    def __enter__(self) -> MemoryEventLog:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EventLogUnavailable("the event log is closed")
        if not self._started:
            self.start()

    # --- producing -------------------------------------------------------

    def produce(self, events: Sequence[Any], timeout_s: float | None = None) -> None:
        """Append items of this log's stream (events, or served records)."""
        del timeout_s  # in-process: the append is done when this returns
        items: list[tuple[bytes | None, bytes, Any]] = []
        codec = self._codec
        now = _now_ms()
        for item in events:
            value = codec.encode(item)
            # What decoding would check; a record that fails is decoded (and refused) later.
            kept = item if codec.keep(item, len(value), now) else None
            items.append((codec.key(item), value, kept))
        with tracing.producing(self.topic, len(items)) as headers:
            self._append(items, headers)

    def produce_raw(self, key: bytes | None, value: bytes) -> None:
        self._append([(key, value, None)])

    def _append(
        self,
        items: list[tuple[bytes | None, bytes, Any]],
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        if not items:
            return
        with self._lock:
            self._check_open()
            now = _now_ms()
            written: dict[int, list[StoredRecord]] = {}
            for key, value, event in items:
                index = partition_for(key, len(self._partitions))
                record = self._partitions[index].append(key, value, now, event, headers)
                written.setdefault(index, []).append(record)
            for index, records in written.items():
                partition = self._partitions[index]
                if partition.files is not None:
                    partition.files.append(records)
                partition.maybe_trim()
            self._changed.notify_all()

    # --- consumer groups -------------------------------------------------

    def consumer(self, group_id: str) -> MemoryEventConsumer:
        with self._lock:
            self._check_open()
            member = MemoryEventConsumer(self, group_id)
            group = self._groups.setdefault(group_id, _Group())
            group.members.append(member)
            self._rebalance(group)
            return member

    def reader(self, partitions: Sequence[int] | None = None) -> MemoryEventConsumer:
        """A consumer of ``partitions`` (default: all) in no group, from their start.

        It commits nothing (``commit`` raises :class:`Conflict`); it is for
        readers that keep their own position, such as the trainer following
        the served log beside its events.
        """
        with self._lock:
            self._check_open()
            member = MemoryEventConsumer(self, None)
            wanted = range(len(self._partitions)) if partitions is None else partitions
            member._positions = {p: self._partitions[p].start for p in wanted}
            return member

    def partition_count(self) -> int:
        return len(self._partitions)

    def _leave(self, member: MemoryEventConsumer) -> None:
        if member.group_id is None:
            return
        with self._lock:
            group = self._groups.get(member.group_id)
            if group is not None and member in group.members:
                group.members.remove(member)
                self._rebalance(group)

    def _rebalance(self, group: _Group) -> None:
        """Range assignment: member i of n gets the i-th contiguous run of partitions."""
        count = len(self._partitions)
        members = len(group.members)
        for index, member in enumerate(group.members):
            first = index * count // members
            last = (index + 1) * count // members
            member._assign(range(first, last), group.committed)
        self._changed.notify_all()

    def _take(
        self, positions: dict[int, int], max_records: int, rotate: int
    ) -> list[tuple[int, StoredRecord, Any]]:
        """Up to ``max_records`` (partition, record, kept event) from ``positions``; advances them.

        Called under the lock. ``rotate`` shifts the starting partition on each
        call so that one busy partition cannot starve the others.
        """
        taken: list[tuple[int, StoredRecord, Any]] = []
        order = sorted(positions)
        if order:
            shift = rotate % len(order)
            order = order[shift:] + order[:shift]
        for index in order:
            partition = self._partitions[index]
            offset = partition.clamp(positions[index])
            records, decoded = partition.read(offset, max_records - len(taken))
            taken.extend(
                (index, record, event) for record, event in zip(records, decoded, strict=True)
            )
            positions[index] = records[-1].offset + 1 if records else offset
            if len(taken) >= max_records:
                break
        return taken

    def _dead_letter(self, letters: list[StoredDeadLetter]) -> None:
        if not letters:
            return
        with self._lock:
            if self._closed:
                raise EventLogUnavailable("the event log is closed")
            self._dead.extend(letters)
            if self._dead_file is not None:
                self._dead_file.append(letters)
            if len(self._dead) >= self._retention + max(1, self._retention // 16):
                del self._dead[: len(self._dead) - self._retention]
                if self._dead_file is not None:
                    self._dead_file.rewrite(self._dead)

    # --- inspection ------------------------------------------------------

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        with self._lock:
            return [
                DeadLetter(
                    reason=d.reason, source=d.source, key=d.key, value=d.value, group=d.group
                )
                for d in self._dead[:limit]
            ]

    def dead_letter_count(self) -> int:
        with self._lock:
            return len(self._dead)

    def end_offsets(self) -> dict[int, int]:
        with self._lock:
            return {index: partition.end for index, partition in enumerate(self._partitions)}

    def beginning_offsets(self) -> dict[int, int]:
        """First offset still held, per partition (retention moves it forward)."""
        with self._lock:
            return {index: partition.start for index, partition in enumerate(self._partitions)}


class MemoryEventConsumer:
    """A member of a consumer group of :class:`MemoryEventLog`."""

    def __init__(self, log: MemoryEventLog, group_id: str | None) -> None:
        self._log = log
        self.group_id = group_id
        """None: a reader of fixed partitions in no group (:meth:`MemoryEventLog.reader`)."""
        self._positions: dict[int, int] = {}
        """Next offset to read, per assigned partition."""
        self._rotate = 0
        self._closed = False
        self._dead = DeadRuns()
        self._first_seen: dict[int, int] = {}
        """Per partition, offset of the first record polled since assignment or seek."""
        self._last_commit: dict[int, int] = {}
        self.dead_lettered = 0

    def _assign(self, partitions: range, committed: dict[int, int]) -> None:
        """New assignment from a rebalance; under the log's lock."""
        kept = {p: o for p, o in self._positions.items() if p in partitions}
        for gone in set(self._positions) - set(kept):
            self._first_seen.pop(gone, None)
            self._last_commit.pop(gone, None)
        for index in partitions:
            if index not in kept:
                start = committed.get(index, self._log._partitions[index].start)
                kept[index] = self._log._partitions[index].clamp(start)
        self._positions = kept

    def _check_open(self) -> None:
        if self._closed:
            raise EventLogUnavailable(f"consumer of group {self.group_id!r} is closed")

    def poll(self, max_records: int, timeout_s: float) -> list[ConsumedEvent]:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        log = self._log
        while True:
            with log._changed:
                self._check_open()
                while True:
                    records = log._take(self._positions, max_records, self._rotate)
                    self._rotate += 1
                    remaining = deadline - time.monotonic()
                    if records or remaining <= 0:
                        break
                    log._changed.wait(remaining)
                    self._check_open()
                group = log._groups.get(self.group_id) if self.group_id is not None else None
                passed = dict(group.committed) if group is not None else {}
            events, dead = self._decode(records, passed)
            if dead:
                log._dead_letter([letter for _, _, letter in dead])
                for partition, offset, _ in dead:
                    self._dead.add(partition, offset)
                self.dead_lettered += len(dead)
            if events or time.monotonic() >= deadline:
                return events

    def _decode(
        self, records: list[tuple[int, StoredRecord, Any]], passed: dict[int, int]
    ) -> tuple[list[ConsumedEvent], list[tuple[int, int, StoredDeadLetter]]]:
        """Valid items, and (partition, offset, letter) of bad records met first here;
        outside the lock (parsing is the cost). ``passed``: the group's committed offsets
        (a bad record below one was dead-lettered when the group first passed it)."""
        events: list[ConsumedEvent] = []
        dead: list[tuple[int, int, StoredDeadLetter]] = []
        decoder = self._log._codec
        partitions = self._log._partitions
        for partition, record, kept in records:
            self._first_seen.setdefault(partition, record.offset)
            traces = partitions[partition].traces
            headers = traces.get(record.offset) if traces else None
            if kept is not None:
                events.append(ConsumedEvent(kept, partition, record.offset, record.ts, headers))
                continue
            try:
                event = decoder.decode(record.value)
            except BadRecord as bad:
                if self._dead.holds(partition, record.offset):
                    continue  # this group dead-lettered it already (a rebalance re-read)
                if record.offset < passed.get(partition, 0):
                    # Behind the group's commit: dead-lettered when first passed. Held as
                    # dead-lettered here too, so a commit moves past it again.
                    self._dead.add(partition, record.offset)
                    continue
                source = source_of(self._log.topic, partition, record.offset)
                letter = StoredDeadLetter(
                    bad.reason, source, record.key, record.value, self.group_id or ""
                )
                dead.append((partition, record.offset, letter))
                continue
            events.append(ConsumedEvent(event, partition, record.offset, record.ts, headers))
        return events, dead

    def _owned(self, partitions: Sequence[int]) -> None:
        missing = sorted(set(partitions) - set(self._positions))
        if missing:
            raise Conflict(
                f"partitions {missing} are not assigned to this member of {self.group_id!r} "
                f"(assigned: {sorted(self._positions)})"
            )

    def commit(self, positions: Sequence[Position] | None = None) -> None:
        log = self._log
        if self.group_id is None:
            raise Conflict("a reader in no group commits nothing; it keeps its own positions")
        with log._lock:
            self._check_open()
            if positions is None:
                chosen = dict(self._positions)
                self._dead = DeadRuns()  # everything polled is committed, bad records too
            else:
                self._owned([p.partition for p in positions])
                chosen = past_dead_letters(
                    positions, self._dead, sorted(self._positions), self._last_commit,
                    self._first_seen,
                )
            group = log._groups[self.group_id]
            group.committed.update(chosen)
            self._last_commit.update(chosen)
            log._save_offsets()

    def committed(self) -> list[Position]:
        log = self._log
        if self.group_id is None:
            return []
        with log._lock:
            committed = log._groups[self.group_id].committed
            return [Position(p, committed[p]) for p in sorted(self._positions) if p in committed]

    def assignment(self) -> list[int]:
        with self._log._lock:
            return sorted(self._positions)

    def wait_for_assignment(self, timeout_s: float) -> list[int]:
        """Membership is granted on creation here, so this never waits."""
        self._check_open()
        return self.assignment()

    def seek(self, positions: Sequence[Position]) -> None:
        log = self._log
        with log._lock:
            self._check_open()
            self._owned([p.partition for p in positions])
            for position in positions:
                self._positions[position.partition] = log._partitions[position.partition].clamp(
                    position.offset
                )
                self._first_seen.pop(position.partition, None)
                self._last_commit.pop(position.partition, None)

    def seek_to_timestamp(self, ts_ms: int) -> None:
        log = self._log
        with log._lock:
            self._check_open()
            for index in self._positions:
                self._positions[index] = log._partitions[index].offset_for_time(ts_ms)
            self._first_seen.clear()
            self._last_commit.clear()

    def seek_to_beginning(self) -> None:
        log = self._log
        with log._lock:
            self._check_open()
            for index in self._positions:
                self._positions[index] = log._partitions[index].start
            self._first_seen.clear()
            self._last_commit.clear()

    def lag(self) -> dict[int, int]:
        log = self._log
        with log._lock:
            return {
                index: log._partitions[index].end - log._partitions[index].clamp(offset)
                for index, offset in sorted(self._positions.items())
            }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._log._leave(self)

    def __enter__(self) -> MemoryEventConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
