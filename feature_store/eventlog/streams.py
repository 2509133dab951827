"""The streams carried by the log's machinery: the user events and the served log.

Both backends (in-process and Kafka) hold any stream the same way: records
keyed by ``user_id`` (so one user's records share a partition number in
every stream), consumer groups, retention and dead letters. A
:class:`StreamSpec` says what differs: topic names, the record codec, and how
long records are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from feature_store.constants import (
    dead_letter_topic,
    events_topic,
    served_dead_letter_topic,
    served_topic,
)
from feature_store.eventlog.codec import EventCodec, RecordCodec, ServedCodec
from feature_store.settings import Settings

StreamName = Literal["events", "served"]


@dataclass(frozen=True)
class StreamSpec:
    name: StreamName
    topic: str
    dead_letter_topic: str
    codec: RecordCodec[Any]
    memory_retention_records: int
    """Records per partition the in-process log keeps."""
    topic_config: dict[str, str]
    """Kafka topic configuration used when vidrec creates the topic."""


def stream_spec(settings: Settings, name: StreamName = "events") -> StreamSpec:
    namespace = settings.event_log.topic_namespace
    limit = settings.event_log.max_record_bytes
    if name == "served":
        served = settings.served_log
        return StreamSpec(
            name,
            served_topic(namespace),
            served_dead_letter_topic(namespace),
            ServedCodec(settings.limits, limit),
            served.memory_retention_records,
            {"retention.ms": str(served.kafka_retention_ms)},
        )
    return StreamSpec(
        name,
        events_topic(namespace),
        dead_letter_topic(namespace),
        EventCodec(settings.limits, limit),
        settings.event_log.memory_retention_records,
        {},
    )
