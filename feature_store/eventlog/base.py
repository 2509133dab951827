"""The event log: the ordered, replayable stream of user events.

Backends beside this file: ``memory`` (in-process, the embedded default,
persisted under the data directory) and ``kafka`` (kafka-python).

Shared semantics (the same tests run against each backend):

- Records are keyed by ``user_id``: one user's events land in one partition
  and stay in order.
- Consumers belong to a group; partitions are split among a group's
  members; positions are committed *manually* (``commit``), so a consumer
  commits only what it has durably processed (at-least-once).
- A record that fails to decode or validate is written to the dead-letter
  topic with the reason and its source position, and consumption carries on
  past it; ``poll`` never raises for bad data.
- ``seek_to_timestamp`` and ``seek`` move a consumer for replay and retraining.
- A bad record is dead-lettered once per consumer group, naming the group
  (the trainer's and the signal feed's each add one entry); a commit moves
  past the bad records dead-lettered right at the committed position, so a
  bad record last in its partition is not met (and dead-lettered) again
  after a restart. A member that reads behind its group's committed offset
  (a restart's warm-up seeking back by time, a retrain seeking to its start
  again) skips the bad records there silently: the group dead-lettered them
  when it first passed them (and a commit at one moves past it again).
- Closing a log closes the consumers it made; a closed log or consumer raises
  :class:`~feature_store.errors.EventLogUnavailable`. Seeking or committing a
  partition this consumer does not own raises
  :class:`~feature_store.errors.Conflict` (after a rebalance, the new owner
  re-reads from the last commit).
- A consumer object is used from one thread at a time (as a Kafka consumer
  must be); the log itself may be shared by threads.
- With tracing on, a produce made inside a trace gives its records a
  ``traceparent`` header (Kafka record headers; the in-process log keeps
  them in memory beside the record) and consumers hand them on
  (``ConsumedRecord.headers``): :mod:`feature_store.runtime.tracing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from feature_store.events import Event

T = TypeVar("T")


@dataclass(frozen=True)
class Position:
    """A place in one partition: the offset of the *next* record to read."""

    partition: int
    offset: int


@dataclass(frozen=True)
class ConsumedRecord(Generic[T]):
    """A valid item of a stream with where it came from."""

    event: T
    """The decoded item: an :class:`Event` on the event log, a served record on the
    served log (:mod:`feature_store.served`)."""
    partition: int
    offset: int
    log_ts: int
    """Time the log stored the record, ms since epoch."""
    headers: Sequence[tuple[str, bytes]] | None = None
    """The record's headers when it has any: the trace context of the request that
    produced it (:mod:`feature_store.runtime.tracing`), when tracing is on."""


ConsumedEvent = ConsumedRecord[Event]
"""A valid event with where it came from."""


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be used, kept for inspection and replay."""

    reason: str
    """Why: the decode or validation error, naming the field."""
    source: str
    """``topic:partition:offset`` of the bad record."""
    key: bytes | None
    value: bytes
    group: str = ""
    """Consumer group that met it ("" in entries written before groups were named)."""


@runtime_checkable
class EventConsumer(Protocol):
    """One member of a consumer group. Use as a context manager."""

    def poll(self, max_records: int, timeout_s: float) -> list[ConsumedEvent]:
        """Up to ``max_records`` valid events; waits at most ``timeout_s`` for the first.

        Bad records met on the way are dead-lettered and skipped (their
        offsets count as consumed).
        """
        ...

    def commit(self, positions: Sequence[Position] | None = None) -> None:
        """Commit ``positions`` (next offsets to read), or everything polled so far.

        A position at the first of a run of records this consumer dead-lettered
        is committed past the run; so is such a run at the last commit of an
        assigned partition that ``positions`` leaves out.
        """
        ...

    @property
    def dead_lettered(self) -> int:
        """Records this consumer dead-lettered so far (a reason to commit an empty poll)."""
        ...

    def committed(self) -> list[Position]:
        """The group's committed positions for this consumer's partitions."""
        ...

    def assignment(self) -> list[int]:
        """Partitions currently assigned to this consumer."""
        ...

    def wait_for_assignment(self, timeout_s: float) -> list[int]:
        """Join the group if not yet joined, without consuming; the assigned partitions.

        Waits at most ``timeout_s``; an empty list means no partition yet (the
        join is slow or the group has more members than partitions). Call it
        before ``seek``/``seek_to_timestamp`` on a fresh consumer, whose group
        membership a broker grants only after a join round (the seek methods
        of a consumer with no partition yet call it themselves, bounded by
        the session plus request timeout).
        """
        ...

    def seek(self, positions: Sequence[Position]) -> None:
        """Read next from these offsets."""
        ...

    def seek_to_timestamp(self, ts_ms: int) -> None:
        """Read next, in every assigned partition, from the first record at or after ``ts_ms``."""
        ...

    def seek_to_beginning(self) -> None: ...

    def lag(self) -> dict[int, int]:
        """Records between this consumer's position and each partition's end."""
        ...

    def close(self) -> None:
        """Leave the group (without committing)."""
        ...

    def __enter__(self) -> EventConsumer: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class EventLog(Protocol):
    """Producer side plus a factory of consumers. Use as a context manager."""

    def produce(self, events: Sequence[Any], timeout_s: float | None = None) -> None:
        """Append items of the log's stream (:class:`Event` for the event log), keyed by
        ``user_id``; returns once they are durable.

        ``timeout_s`` bounds the wait for the acknowledgement (default: the
        backend's request timeout); past it, or while the backend is known
        to be down, :class:`~feature_store.errors.EventLogUnavailable` is
        raised and the items may or may not be stored (at least once).
        """
        ...

    def produce_raw(self, key: bytes | None, value: bytes) -> None:
        """Append an undecoded record (replays, tools, and tests of bad data)."""
        ...

    def consumer(self, group_id: str) -> EventConsumer:
        """A new member of ``group_id`` reading the log's topic."""
        ...

    def reader(self, partitions: Sequence[int] | None = None) -> EventConsumer:
        """A consumer of ``partitions`` (default: all) in no group, from their start; it
        keeps its own positions (``commit`` raises :class:`~feature_store.errors.Conflict`)."""
        ...

    def partition_count(self) -> int: ...

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead-lettered records."""
        ...

    def dead_letter_count(self) -> int: ...

    def end_offsets(self) -> dict[int, int]:
        """Next offset to be written, per partition."""
        ...

    def beginning_offsets(self) -> dict[int, int]:
        """First offset still held, per partition (retention moves it forward)."""
        ...

    def close(self) -> None:
        """Flush, then close every consumer this log made and the log itself."""
        ...

    def __enter__(self) -> EventLog: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class DeadRuns:
    """Runs of consecutive records one consumer dead-lettered, per partition.

    Why: a consumer commits the positions of what it *processed*, and a bad
    record is not processed, so a bad record last in its partition was
    never committed past and was dead-lettered again after every restart.
    The consumers record here what they dead-lettered and :meth:`past`
    moves a commit over a run that starts where the commit stands. Both
    backends use it. Bounded by the bad records met while a consumer lives;
    runs behind a committed position are dropped.
    """

    def __init__(self) -> None:
        self._runs: dict[int, dict[int, int]] = {}
        """Per partition: first offset of a run -> offset after its last record."""
        self._ends: dict[int, dict[int, int]] = {}
        """Per partition: offset after a run -> its first offset."""

    def add(self, partition: int, offset: int) -> None:
        runs = self._runs.setdefault(partition, {})
        ends = self._ends.setdefault(partition, {})
        if self.holds(partition, offset):
            return
        start = ends.pop(offset, offset)  # extends the run that ends right here
        end = offset + 1
        following = runs.pop(end, None)  # joins the run that starts right after
        if following is not None:
            del ends[following]
            end = following
        runs[start] = end
        ends[end] = start

    def holds(self, partition: int, offset: int) -> bool:
        """Whether ``offset`` was dead-lettered by this consumer already."""
        return any(start <= offset < end for start, end in self._runs.get(partition, {}).items())

    def past(self, partition: int, offset: int) -> int:
        """``offset``, moved past a dead-lettered run starting there; older runs dropped."""
        runs = self._runs.get(partition)
        if not runs:
            return offset
        offset = runs.get(offset, offset)
        ends = self._ends[partition]
        for start in [start for start, end in runs.items() if end <= offset]:
            del ends[runs.pop(start)]
        return offset

    def partitions(self) -> list[int]:
        return [p for p, runs in self._runs.items() if runs]


def past_dead_letters(
    positions: Sequence[Position],
    dead: DeadRuns,
    assigned: Sequence[int],
    last_commit: dict[int, int],
    first_seen: dict[int, int],
) -> dict[int, int]:
    """The offsets to commit for ``positions``, moved past dead-lettered runs.

    An assigned partition that ``positions`` leaves out is committed too
    when a run starts where it stands (its last commit by this consumer,
    else the first record polled from it): a partition whose only new
    records were bad ones gets past them.
    """
    chosen = {p.partition: dead.past(p.partition, p.offset) for p in positions}
    for partition in dead.partitions():
        if partition in chosen or partition not in assigned:
            continue
        base = last_commit.get(partition, first_seen.get(partition))
        if base is not None:
            moved = dead.past(partition, base)
            if moved != base:
                chosen[partition] = moved
    return chosen
