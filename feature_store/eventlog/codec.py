"""Bytes on the log to validated events, shared by every backend.

Both backends store encoded records and decode them on consume through
:class:`RecordDecoder`, so a poisoned record is refused with the same reason
whichever backend holds it, and the dead-letter entries look alike.
"""

from __future__ import annotations

import xxhash

from feature_store.errors import InvalidInput
from feature_store.events import Event, EventValidator
from feature_store.settings import EventLimits


class BadRecord(Exception):
    """A record that cannot become an event; ``reason`` names the problem or field.

    Internal to the event log: backends turn it into a dead letter and go on,
    so it never reaches callers of ``poll``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RecordDecoder:
    """Checks size, then decodes and validates one record value.

    ``max_record_bytes`` is checked before decoding so that one huge record
    costs no parsing; validation uses the same :class:`EventValidator` limits
    as HTTP ingress.
    """

    def __init__(self, limits: EventLimits, max_record_bytes: int) -> None:
        self.validator = EventValidator(limits)
        self.max_record_bytes = max_record_bytes

    def decode(self, value: bytes | None) -> Event:
        """The event in ``value``; raises :class:`BadRecord` with the reason."""
        if value is None:
            raise BadRecord("body: empty record (no value)")
        if len(value) > self.max_record_bytes:
            raise BadRecord(
                f"body: record of {len(value)} bytes exceeds max_record_bytes="
                f"{self.max_record_bytes}"
            )
        try:
            return self.validator.parse_json(value)
        except InvalidInput as exc:
            # str(exc) is "field: message", e.g. "video_id: Field required".
            raise BadRecord(str(exc)) from exc


def event_key(event: Event) -> bytes:
    """The record key: ``user_id`` as UTF-8, so one user's events share a partition."""
    return event.user_id.encode()


def partition_for(key: bytes | None, partitions: int) -> int:
    """Stable partition of ``key`` (xxh64), identical across processes and restarts.

    Python's ``hash()`` is salted per process and would scatter a user's
    events after a restart. A record without a key goes to partition 0.
    """
    if key is None:
        return 0
    return xxhash.xxh64_intdigest(key) % partitions


def source_of(topic: str, partition: int, offset: int) -> str:
    """The ``topic:partition:offset`` form of a dead letter's source."""
    return f"{topic}:{partition}:{offset}"
