"""``vidrec backfill``: historical events from a file into the event log, as live ones go.

The file (CSV, Parquet or JSON lines; :mod:`feature_store.event_files`) is
read row by row. Every row goes to the event log, and the log's consumers
(the trainer, the signal feed, the experiment feed) decode and validate it
exactly as they do a live event, with the same :class:`EventValidator` and
limits as ``POST /v1/events``: a row that breaks the contract is
dead-lettered with its reason, once per consumer group, and the rows next to
it are kept. Nothing is shifted in time (unlike ``vidrec replay``, which
moves a dataset older than ``limits.min_ts_ms`` forward as a whole): an
event older than that limit, or in the future, is refused like a live one.

- Rows with an event's structure go in event-time order (stable), in
  batches (``produce``); rows that are no event at all (a missing field, a
  wrong type) go after them, raw, as read (``produce_raw``), keyed by their
  ``user_id`` when they have one, so their dead letters show what the file
  held.
- The same validator runs here first, only to *report*: the returned
  :class:`BackfillReport` says how many rows the consumers will dead-letter
  and why (the first few, with ``<file>:<line>``).
- ``event_id`` is the idempotency key: a backfill run twice writes every row
  twice, and the trainer skips the second copy while it is within its
  dedupe window (``trainer.dedupe_window``).
- A videos file (optional) is upserted into the catalog first, validated as
  ``PUT /v1/videos`` validates; its bad rows are reported, not stored.

Backfill before the history's users are active, or the live events they
made since are in the log before their older ones: the trainer and the
signal feed take events in log order.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from feature_store.errors import InvalidInput
from feature_store.event_files import Rejected, UnreadableRow, parse_event_rows, read_videos
from feature_store.events import Event, EventValidator
from feature_store.runtime.resources import Resources

log = logging.getLogger(__name__)

CHUNK = 1000
"""Events per ``produce`` call (one acknowledgement wait each with Kafka)."""


@dataclass
class BackfillReport:
    """What a backfill wrote, and what its consumers will refuse."""

    rows: int
    """Rows read from the events file."""
    produced: int
    """Records written to the event log (every row)."""
    refused: Rejected
    """Rows that will be dead-lettered (checked here with the consumers' validator)."""
    first_ts: int | None = None
    last_ts: int | None = None
    """Event time range of the rows with an event's structure, ms since the epoch."""
    videos: int = 0
    """Catalog records upserted from the videos file."""
    videos_rejected: Rejected = field(default_factory=Rejected)

    def describe(self) -> str:
        span = ""
        if self.first_ts is not None and self.last_ts is not None:
            first = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.first_ts / 1000))
            last = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.last_ts / 1000))
            span = f" from {first} to {last} UTC"
        text = f"{self.produced} of {self.rows} rows written to the event log{span}"
        if self.refused.count:
            text += f"; the consumers will dead-letter {self.refused.describe()}"
        if self.videos or self.videos_rejected.count:
            text += f"; {self.videos} videos upserted"
            if self.videos_rejected.count:
                text += f" ({self.videos_rejected.describe()})"
        return text


def backfill(
    resources: Resources,
    events_path: Path,
    *,
    videos_path: Path | None = None,
    fmt: str = "auto",
    now_ms: int | None = None,
) -> BackfillReport:
    """Write an events file (and a videos file) to the event log (and catalog)."""
    parsed, unreadable = parse_event_rows(Path(events_path), fmt)
    if not parsed and not unreadable:
        raise InvalidInput("events", f"{events_path}: no rows")
    limits = resources.settings.limits
    now = int(time.time() * 1000) if now_ms is None else now_ms
    refused = _refused(EventValidator(limits), parsed, unreadable, now)
    events = sorted((event for _, event in parsed), key=lambda e: e.ts)
    report = BackfillReport(rows=len(parsed) + len(unreadable), produced=0, refused=refused)
    if events:
        report.first_ts, report.last_ts = events[0].ts, events[-1].ts
    if videos_path is not None:
        videos, rejected = read_videos(
            Path(videos_path), limits, first_event_ts=report.first_ts or now
        )
        resources.catalog.upsert(videos)
        report.videos, report.videos_rejected = len(videos), rejected
    for start in range(0, len(events), CHUNK):
        resources.event_log.produce(events[start : start + CHUNK])
        report.produced += len(events[start : start + CHUNK])
    for row in unreadable:
        user = row.fields.get("user_id")
        key = user.encode() if isinstance(user, str) and user else None
        resources.event_log.produce_raw(key, json.dumps(row.fields, default=str).encode())
        report.produced += 1
    log.info("backfill %s: %s", events_path, report.describe())
    return report


def _refused(
    validator: EventValidator, parsed: Sequence[tuple[str, Event]],
    unreadable: Sequence[UnreadableRow], now_ms: int,
) -> Rejected:
    """The rows the consumers will dead-letter, in file order of their kind."""
    refused = Rejected()
    for where, event in parsed:
        try:
            validator.check(event, now_ms)
        except InvalidInput as exc:
            refused.add(where, exc)
    for row in unreadable:
        refused.add(row.where, row.error)
    return refused
