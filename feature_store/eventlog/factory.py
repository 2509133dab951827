"""Open the configured event log backend."""

from __future__ import annotations

from pathlib import Path

from feature_store.eventlog.base import EventLog
from feature_store.settings import Settings


def open_event_log(settings: Settings, data_dir: Path | None = None) -> EventLog:
    """A started event log chosen by ``settings.event_log.backend``; the caller closes it.

    ``memory`` persists under ``data_dir / <topic namespace>`` when ``data_dir``
    (the event log's directory, e.g. ``settings.data_dir / "eventlog"``) is
    given, and keeps everything in memory otherwise. ``kafka`` ignores
    ``data_dir``; it connects and creates missing topics here, raising
    :class:`~feature_store.errors.EventLogUnavailable` if no broker answers.
    """
    if settings.event_log.backend == "kafka":
        from feature_store.eventlog.kafka import KafkaEventLog

        return KafkaEventLog(settings).start()

    from feature_store.eventlog.memory import MemoryEventLog

    directory = None if data_dir is None else data_dir / settings.event_log.topic_namespace
    return MemoryEventLog(settings, directory).start()
