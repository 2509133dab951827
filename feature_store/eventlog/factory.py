"""Open the configured event log backend."""

from __future__ import annotations

from pathlib import Path

from feature_store.eventlog.base import EventLog
from feature_store.eventlog.streams import StreamName, stream_spec
from feature_store.settings import Settings


def open_event_log(
    settings: Settings,
    data_dir: Path | None = None,
    stream: StreamName = "events",
    *,
    wait: bool = True,
) -> EventLog:
    """A started log of ``stream`` chosen by ``settings.event_log.backend``; the caller closes it.

    ``memory`` persists under ``data_dir / <topic namespace>`` (the served log:
    ``<topic namespace>.served``) when ``data_dir`` (the event log's
    directory, e.g. ``settings.data_dir / "eventlog"``) is given, and keeps
    everything in memory otherwise. ``kafka`` ignores ``data_dir``; it
    connects and creates missing topics here, raising
    :class:`~feature_store.errors.EventLogUnavailable` if no broker answers,
    unless ``wait`` is False: then it connects in the background and the log
    refuses writes at once until it has (the service starts without a broker).
    """
    spec = stream_spec(settings, stream)
    if settings.event_log.backend == "kafka":
        from feature_store.eventlog.kafka import KafkaEventLog

        log = KafkaEventLog(settings, spec)
        return log.start() if wait else log.start_in_background()

    from feature_store.eventlog.memory import MemoryEventLog

    name = settings.event_log.topic_namespace + ("" if stream == "events" else f".{stream}")
    directory = None if data_dir is None else data_dir / name
    return MemoryEventLog(settings, directory, spec).start()
