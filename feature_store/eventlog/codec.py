"""Bytes on the log to validated items, shared by every backend.

Both backends store encoded records and decode them on consume through a
stream's :class:`RecordCodec`, so a poisoned record is refused with the same
reason whichever backend holds it, and the dead-letter entries look alike.
Two streams use the log's machinery: the events (:class:`EventCodec`) and the
served log (:class:`ServedCodec`, :mod:`feature_store.served`).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import xxhash

from feature_store.errors import InvalidInput
from feature_store.events import Event, EventValidator, encode_event
from feature_store.json_keys import REPEATED_KEY, repeated_keys
from feature_store.served import ServedRecord, decode_served, encode_served
from feature_store.settings import EventLimits

T = TypeVar("T")


class BadRecord(Exception):
    """A record that cannot become an event; ``reason`` names the problem or field.

    Internal to the event log: backends turn it into a dead letter and go on,
    so it never reaches callers of ``poll``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RecordCodec(Protocol, Generic[T]):
    """How one stream's items become records (key, value) and back."""

    max_record_bytes: int

    def encode(self, item: T) -> bytes: ...

    def key(self, item: T) -> bytes | None:
        """The record key: the user, so one user's records share a partition."""
        ...

    def decode(self, value: bytes | None) -> T:
        """The item in ``value``; raises :class:`BadRecord` with the reason."""
        ...

    def keep(self, item: T, size: int, now_ms: int) -> bool:
        """Whether a produced ``item`` (encoded in ``size`` bytes) would decode as itself, so
        an in-process log may hand it to consumers without decoding it again."""
        ...


def _check_size(value: bytes | None, limit: int) -> bytes:
    if value is None:
        raise BadRecord("body: empty record (no value)")
    if len(value) > limit:
        raise BadRecord(f"body: record of {len(value)} bytes exceeds max_record_bytes={limit}")
    return value


class EventCodec:
    """User events: JSON, validated against the same limits as HTTP ingress.

    ``max_record_bytes`` is checked before decoding so that one huge record
    costs no parsing. A record naming a key twice is refused
    (:mod:`feature_store.json_keys`).
    """

    def __init__(self, limits: EventLimits, max_record_bytes: int) -> None:
        self.validator = EventValidator(limits)
        self.max_record_bytes = max_record_bytes

    def encode(self, item: Event) -> bytes:
        return encode_event(item)

    def key(self, item: Event) -> bytes | None:
        return event_key(item)

    def decode(self, value: bytes | None) -> Event:
        value = _check_size(value, self.max_record_bytes)
        try:
            event = self.validator.parse_json(value)
        except InvalidInput as exc:
            # str(exc) is "field: message", e.g. "video_id: Field required".
            raise BadRecord(str(exc)) from exc
        # The keys the parser kept: the event's and its context's (the only nested object).
        kept = len(event.model_fields_set) + len(event.context.model_fields_set)
        repeated = repeated_keys(value, kept)
        if repeated:  # the parser kept the last value; another reader may take the first
            raise BadRecord(f"{repeated[0]}: {REPEATED_KEY}")
        return event

    def keep(self, item: Event, size: int, now_ms: int) -> bool:
        if size > self.max_record_bytes:
            return False
        try:  # the limits only get easier with time: valid now, valid when consumed
            self.validator.check(item, now_ms)
        except InvalidInput:
            return False
        return True


RecordDecoder = EventCodec
"""The events' codec under its earlier name."""


class ServedCodec:
    """Served-log records (:mod:`feature_store.served`)."""

    def __init__(self, limits: EventLimits, max_record_bytes: int) -> None:
        self.max_id_length = limits.max_id_length
        self.max_record_bytes = max_record_bytes

    def encode(self, item: ServedRecord) -> bytes:
        return encode_served(item)

    def key(self, item: ServedRecord) -> bytes | None:
        return item.user_id.encode()

    def decode(self, value: bytes | None) -> ServedRecord:
        value = _check_size(value, self.max_record_bytes)
        try:
            return decode_served(value, self.max_id_length)
        except InvalidInput as exc:
            raise BadRecord(str(exc)) from exc

    def keep(self, item: ServedRecord, size: int, now_ms: int) -> bool:
        return size <= self.max_record_bytes  # built by the service from checked values


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
