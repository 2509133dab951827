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
- A bad record is dead-lettered each time a consumer meets it (a second
  group, or a replay, adds another entry), as with a Kafka DLQ topic.
- Closing a log closes the consumers it made; a closed log or consumer raises
  :class:`~feature_store.errors.EventLogUnavailable`. Seeking or committing a
  partition this consumer does not own raises
  :class:`~feature_store.errors.Conflict` (after a rebalance, the new owner
  re-reads from the last commit).
- A consumer object is used from one thread at a time (as a Kafka consumer
  must be); the log itself may be shared by threads.
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
        """Commit ``positions`` (next offsets to read), or everything polled so far."""
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

    def produce(self, events: Sequence[Any]) -> None:
        """Append items of the log's stream (:class:`Event` for the event log), keyed by
        ``user_id``; returns once they are durable."""
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
