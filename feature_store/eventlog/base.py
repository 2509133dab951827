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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from feature_store.events import Event


@dataclass(frozen=True)
class Position:
    """A place in one partition: the offset of the *next* record to read."""

    partition: int
    offset: int


@dataclass(frozen=True)
class ConsumedEvent:
    """A valid event with where it came from."""

    event: Event
    partition: int
    offset: int
    log_ts: int
    """Time the log stored the record, ms since epoch."""


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


@runtime_checkable
class EventLog(Protocol):
    """Producer side plus a factory of consumers. Use as a context manager."""

    def produce(self, events: Sequence[Event]) -> None:
        """Append events, keyed by ``user_id``; returns once they are durable."""
        ...

    def produce_raw(self, key: bytes | None, value: bytes) -> None:
        """Append an undecoded record (replays, tools, and tests of bad data)."""
        ...

    def consumer(self, group_id: str) -> EventConsumer:
        """A new member of ``group_id`` reading the events topic."""
        ...

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead-lettered records."""
        ...

    def dead_letter_count(self) -> int: ...

    def end_offsets(self) -> dict[int, int]:
        """Next offset to be written, per partition."""
        ...

    def close(self) -> None: ...
