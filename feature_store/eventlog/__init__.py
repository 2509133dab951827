"""The event log: the ordered, replayable stream of user events.

``open_event_log(settings, data_dir)`` picks the backend; both implement
:class:`EventLog` and :class:`EventConsumer` (see ``base`` for the shared
semantics). The Kafka backend is imported lazily so the embedded mode does
not load kafka-python.
"""

from feature_store.eventlog.base import (
    ConsumedEvent,
    DeadLetter,
    EventConsumer,
    EventLog,
    Position,
)
from feature_store.eventlog.factory import open_event_log
from feature_store.eventlog.memory import MemoryEventConsumer, MemoryEventLog

__all__ = [
    "ConsumedEvent",
    "DeadLetter",
    "EventConsumer",
    "EventLog",
    "KafkaEventConsumer",
    "KafkaEventLog",
    "MemoryEventConsumer",
    "MemoryEventLog",
    "Position",
    "open_event_log",
]


def __getattr__(name: str) -> object:
    """``KafkaEventLog`` and ``KafkaEventConsumer`` on first use (kafka-python loads then)."""
    if name in ("KafkaEventLog", "KafkaEventConsumer"):
        from feature_store.eventlog import kafka

        return getattr(kafka, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
