"""The trainer's side of the served log: impressions trained on the features they were served with.

The service logs what it recommended with the feature values it scored
(:mod:`feature_store.served`); clients send the ``recommendation_id`` back on
their events. An event naming a recommendation (an impression, or an
engagement that no impression preceded) whose record is found, for the same
user, a video of that response and the trainer's schema, takes the served
item's values and score as the values of its shown moment
(:mod:`trainer.labels`). Anything else is featurised from the stores as the
event arrives (still point in time), and counted.

**Reading.** A background thread (:class:`ServedJoin`'s reader) follows the
served partitions of the trainer's events partitions and keeps the records
in a bounded index, ahead of the batches: a record is written by the
service before the client even gets its response, so it is normally
indexed before its impression is consumed. The reader stays at most
``READ_AHEAD_MS`` (log time) ahead of the newest event trained, and the
index forgets records older than ``served_log.join_window_ms`` behind it.

**Waiting, by watermark.** The service writes its records from a queue, so
under load a record may reach the log a little after the impression that
names it. For each served partition the reader keeps a watermark: the
newest log time it has read there, or the moment it last found itself at
the partition's end (a lag check, made only while a batch waits). A batch
waits until each id it names is indexed or the watermark of the id's
partition is ``served_log.join_lookahead_ms`` past the event's log time; in
the second case the record does not exist (yet) and the event is counted
*missing*. In real time that wait is at most the lookahead, and only for
ids without records; a trainer catching up never waits (the watermarks are
ahead). A batch waits ``served_log.join_max_wait_ms`` at most (well under
the consumer group's poll interval): past it, the ids not found are
featurised from the stores (*late*), and should the reader not have moved
at all meanwhile (the served topic unreachable) later batches do not wait
again until it does.

Only ids of logged responses are joined: an id says whether its response
was logged (:mod:`feature_store.recommendation_ids`: a fallback, which no
model ranked, has no record), so events naming a fallback are featurised
from the stores at once, neither waited for nor counted. Outcomes, counted
per event naming a logged response (``status()["served"]`` and the
trainer's ``vidrec_trainer_served_join_total{outcome}``):

- ``joined``: trained on the values it was served with;
- ``missing``: the served log was read past the event's time (plus the
  lookahead) without a record of that id: the service dropped it (its
  ``vidrec_served_log_records_total{outcome="dropped"|"failed"}``);
- ``late``: the trainer stopped waiting before the reader got that far;
- ``unknown``: the record exists, but not for this user or without this
  video: a recommendation the service never made to them (a client bug, or
  a forged id);
- ``other_schema``: the record was scored with another feature schema (the
  responses served just before a schema change).

One refinement of "as served": columns computed per request from the
request's context (position, surface, device...) are recomputed with the
event's context laid over the request's, and the served position where
neither gives one. The service scores before it knows where each item will
be shown; the impression knows. Everything else (the user's history, the
video's counters, the clock) is exactly what was scored.

Which partitions: the served log is keyed by user like the events, so the
trainer reads the served partitions with the numbers of its events
partitions (when both topics have as many partitions; otherwise all of
them). It keeps no offsets of its own: after a restart or a rebalance it
re-reads from ``served_log.join_window_ms`` before the events it resumes at,
and reading a record twice is harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from feature_store.errors import BackendUnavailable
from feature_store.eventlog.base import ConsumedRecord, EventConsumer, EventLog
from feature_store.events import Event
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.sources import SOURCES
from feature_store.models.registry import family_of
from feature_store.recommendation_ids import logged_response
from feature_store.runtime.worker import Worker
from feature_store.served import ServedRecord
from feature_store.settings import ServedLogSettings
from trainer.labels import merge_context

log = logging.getLogger(__name__)

OUTCOMES = ("joined", "missing", "late", "unknown", "other_schema")
"""What became of an event naming a recommendation (see the module docstring)."""

_POLL = 2000
READ_AHEAD_MS = 60_000
"""How far (log time) the reader reads past the newest event trained, at most."""
_LAG_EVERY_S = 0.2
"""Lag checks (one broker round trip) while a batch waits, at most this often."""
_UNKNOWN = -1
"""The watermark of a partition not read yet."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Follow:
    """What the loop asked the reader to follow: partitions (None: all), and from when."""

    def __init__(self, partitions: list[int] | None, start_ts: int | None) -> None:
        self.partitions = partitions
        self.start_ts = start_ts


class ServedJoin:
    """The served log's index, its reader thread and the join (see the module doc)."""

    def __init__(
        self,
        served_log: EventLog,
        settings: ServedLogSettings,
        extractor: FeatureExtractor,
        family: str = "main",
        outcomes: Any = None,
    ) -> None:
        self.log = served_log
        self.window_ms = settings.join_window_ms
        self.lookahead_ms = settings.join_lookahead_ms
        self.max_wait_s = settings.join_max_wait_ms / 1000.0
        self.max_records = settings.join_max_records
        self.extractor = extractor
        self.family = family
        """This trainer's model family: served scores of its own versions are its
        predictions as shown; another family's are not (see :meth:`moments`)."""
        self.layout = extractor.layout
        self.schema_hash = extractor.schema.schema_hash()
        self.outcomes = outcomes
        """A Prometheus counter labelled by outcome (the trainer's), or None."""
        self.counts: Counter[str] = Counter({name: 0 for name in OUTCOMES})
        self._context_columns = [
            (j, col)
            for j, col in enumerate(extractor.schema.categorical)
            if SOURCES[col.source].per_request
        ]
        self._cond = threading.Condition()
        # Everything below is guarded by _cond (the reader thread writes, the loop reads).
        self._records: OrderedDict[str, tuple[ServedRecord, int]] = OrderedDict()
        """recommendation_id -> (record, log time), oldest first."""
        self._marks: dict[int, int] = {}
        """Served partition -> watermark, ms (see the module docstring)."""
        self._aligned = False
        """Whether the served partitions followed are the events partitions' numbers."""
        self._progress = 0
        """Bumped whenever the reader indexes records or moves a watermark."""
        self._gave_up_at: int | None = None
        """``_progress`` when a batch last gave up waiting: later ones do not wait again
        until it moves."""
        self._need_ms: int | None = None
        """A waiting batch needs the watermarks this far: the reader checks its lag then."""
        self._trained_ts = 0
        """Newest event log time trained: the read-ahead's and the window's reference."""
        self._wanted: _Follow | None = None
        self.reader_error: str | None = None
        self.waited_s = 0.0
        """Seconds batches spent waiting for the reader, in all (since this process started)."""
        self._worker = Worker("vidrec-served-reader", self._run)

    def status(self) -> dict[str, Any]:
        with self._cond:
            held = len(self._records)
            marks = [m for m in self._marks.values() if m != _UNKNOWN]
        named = sum(self.counts.values())
        return {
            **{name: self.counts[name] for name in OUTCOMES},
            "join_rate": self.counts["joined"] / named if named else None,
            "held": held,
            "read_to_ms": min(marks) if marks else None,
            "waited_s": round(self.waited_s, 3),
            "reader_error": self.reader_error,
        }

    def load_counts(self, counts: dict[str, int]) -> None:
        """Totals from a checkpoint (the dashboard shows them across restarts)."""
        for name in OUTCOMES:
            self.counts[name] = int(counts.get(name, 0))

    def close(self) -> None:
        self._worker.stop()

    # --- following ------------------------------------------------------------

    def follow(
        self, partitions: list[int] | None, start_ts: int | None, aligned: bool = False
    ) -> None:
        """Follow the served ``partitions`` (None: all) from ``join_window_ms`` before
        ``start_ts`` (None: their start). A no-op while the partitions are unchanged."""
        with self._cond:
            if self._wanted is not None and self._wanted.partitions == partitions:
                return
            begin = None if start_ts is None else max(0, start_ts - self.window_ms)
            self._wanted = _Follow(partitions, begin)
            self._aligned = aligned and partitions is not None
            self._marks = {}
            self._cond.notify_all()
        self._worker.start()

    def trained_to(self, log_ts: int) -> None:
        """The newest event log time trained: forget records ``join_window_ms`` older."""
        with self._cond:
            self._trained_ts = max(self._trained_ts, log_ts)
            self._evict()

    def _evict(self) -> None:
        oldest = self._trained_ts - self.window_ms
        records = self._records
        while records and (
            len(records) > self.max_records or next(iter(records.values()))[1] < oldest
        ):
            records.popitem(last=False)

    # --- the reader thread -----------------------------------------------------

    def _run(self, stop: threading.Event) -> None:
        reader: EventConsumer | None = None
        following: _Follow | None = None
        next_lag = 0.0
        try:
            while not stop.is_set():
                with self._cond:
                    wanted = self._wanted
                try:
                    if wanted is not following:
                        if reader is not None:
                            reader.close()
                            reader = None
                        reader = self._open(wanted)
                        following = wanted
                    if reader is None or self._ahead():
                        stop.wait(0.02)
                        continue
                    got = cast(list[ConsumedRecord[ServedRecord]], reader.poll(_POLL, 0.1))
                    self._index(got)
                    if len(got) < _POLL and time.monotonic() >= next_lag and self._lag_due():
                        next_lag = time.monotonic() + _LAG_EVERY_S
                        self._check_lag(reader)
                    self.reader_error = None
                except BackendUnavailable as exc:  # the broker: retried, batches stop waiting
                    self.reader_error = str(exc)
                    stop.wait(1.0)
                except Exception as exc:  # a bug must not end the join for good: logged, retried
                    log.exception("served log reader failed; retrying in 5 s")
                    self.reader_error = f"reader failed: {exc!r}"
                    stop.wait(5.0)
        finally:
            if reader is not None:
                reader.close()

    def _open(self, wanted: _Follow | None) -> EventConsumer | None:
        if wanted is None or wanted.partitions == []:
            return None
        partitions = (
            list(range(self.log.partition_count()))
            if wanted.partitions is None
            else wanted.partitions
        )
        reader = self.log.reader(partitions)
        try:
            if wanted.start_ts is not None:
                reader.seek_to_timestamp(wanted.start_ts)
        except BaseException:
            reader.close()
            raise
        with self._cond:
            if self._wanted is wanted:
                self._marks = {p: _UNKNOWN for p in partitions}
        return reader

    def _ahead(self) -> bool:
        """Whether every followed partition is read ``READ_AHEAD_MS`` past the trainer."""
        with self._cond:
            if not self._trained_ts or not self._marks:
                return False
            target = self._trained_ts + self.lookahead_ms + READ_AHEAD_MS
            return min(self._marks.values()) >= target

    def _lag_due(self) -> bool:
        with self._cond:
            return self._need_ms is not None and _now_ms() >= self._need_ms

    def _index(self, got: list[ConsumedRecord[ServedRecord]]) -> None:
        if not got:
            return
        with self._cond:
            records, marks = self._records, self._marks
            for record in got:
                served = record.event
                records.pop(served.recommendation_id, None)
                records[served.recommendation_id] = (served, record.log_ts)
                if record.log_ts > marks.get(record.partition, _UNKNOWN):
                    marks[record.partition] = record.log_ts
            self._evict()
            self._progress += 1
            self._cond.notify_all()

    def _check_lag(self, reader: EventConsumer) -> None:
        """Mark the partitions read to their end as read up to now (before the check)."""
        checked_at = _now_ms()
        lag = reader.lag()
        with self._cond:
            for partition, behind in lag.items():
                if behind == 0 and partition in self._marks:
                    self._marks[partition] = max(self._marks[partition], checked_at)
            self._progress += 1
            self._cond.notify_all()

    # --- waiting ---------------------------------------------------------------

    def _mark(self, partition: int) -> int:
        marks = self._marks
        if self._aligned and partition in marks:
            return marks[partition]
        return min(marks.values()) if marks else _UNKNOWN

    def _await(self, wanted: list[tuple[str, int, int]]) -> set[str]:
        """Wait until each ``(id, partition, log time)`` is indexed or past its partition's
        watermark (see the module docstring), at most ``join_max_wait_ms``; the ids given up
        on (late). After a wait in vain, later batches wait only once the reader moved."""
        lookahead = self.lookahead_ms
        deadline = time.monotonic() + self.max_wait_s
        with self._cond:
            while True:
                left = [
                    (rec_id, ts)
                    for rec_id, partition, ts in wanted
                    if rec_id not in self._records and self._mark(partition) < ts + lookahead
                ]
                if not left:
                    self._need_ms = None
                    return set()
                if self._gave_up_at == self._progress or time.monotonic() >= deadline:
                    self._gave_up_at = self._progress
                    self._need_ms = None
                    return {rec_id for rec_id, _ in left}
                self._need_ms = min(ts for _, ts in left) + lookahead
                self._cond.wait(0.05)

    # --- joining -----------------------------------------------------------

    def moments(
        self,
        events: Sequence[Event],
        partitions: Sequence[int] | None = None,
        log_times: Sequence[int] | None = None,
    ) -> tuple[list[int], npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
        """For ``events`` (shown moments, with their events partitions and log times:
        default, now), which were served here and the values and scores they were served
        with: ``(positions, (n, W) values, (n,) scores)``. Waits as the module doc says."""
        if self._wanted is None:
            self.follow(None, None)
        named = [  # a fallback's id says nothing was logged: no record to wait for
            (i, e.recommendation_id)
            for i, e in enumerate(events)
            if e.recommendation_id is not None and logged_response(e.recommendation_id)
        ]
        entries, late = self._read_records(named, partitions, log_times)
        found: list[int] = []
        rows: list[npt.NDArray[np.uint64]] = []
        scores: list[float] = []
        contexts: list[FeatureRow] = []
        outcomes: Counter[str] = Counter()
        for i, rec_id in named:
            entry = entries[rec_id]
            if entry is None:
                outcomes["late" if rec_id in late else "missing"] += 1
                continue
            joined = self._join(events[i], entry[0])
            if isinstance(joined, str):
                outcomes[joined] += 1
                continue
            found.append(i)
            rows.append(joined[0])
            contexts.append(joined[1])
            scores.append(joined[2])
        outcomes["joined"] = len(found)
        self._count(outcomes)
        if not found:
            return [], np.zeros((0, self.layout.width), np.uint64), np.zeros(0)
        packed = np.stack(rows)
        for j, col in self._context_columns:
            packed[:, j] = self.extractor.keys(col, contexts)
        return found, packed, np.array(scores)

    def _read_records(
        self,
        named: list[tuple[int, str]],
        partitions: Sequence[int] | None,
        log_times: Sequence[int] | None,
    ) -> tuple[dict[str, tuple[ServedRecord, int] | None], set[str]]:
        """The served records the ``(position, recommendation_id)`` pairs name (None: not
        read), after waiting for the unread ones; and the ids given up as late."""
        now = _now_ms()
        with self._cond:
            unread = [
                (rec_id, partitions[i] if partitions is not None else -1,
                 log_times[i] if log_times is not None else now)
                for i, rec_id in named
                if rec_id not in self._records
            ]
        late: set[str] = set()
        if unread:
            started = time.monotonic()
            late = self._await(unread)
            self.waited_s += time.monotonic() - started
        with self._cond:
            return {rec_id: self._records.get(rec_id) for _, rec_id in named}, late

    def _join(
        self, event: Event, record: ServedRecord
    ) -> str | tuple[npt.NDArray[np.uint64], FeatureRow, float]:
        """``event``'s shown moment from its response's record: the values, the feature
        row of its context and the score it was served with; or why not (an outcome)."""
        at = record.position_of(event.video_id)
        if at is None or record.user_id != event.user_id:
            return "unknown"
        if not self._fits(record):
            return "other_schema"
        item = record.items[at]
        own = record.model_version is not None and (
            family_of(record.model_version) == self.family
        )
        values = np.empty(self.layout.width, dtype=np.uint64)
        values[self.layout.request_slots] = record.request_values
        values[self.layout.item_slots] = record.item_values[at]
        shown = record.context.model_copy(update={"position": item.position})
        context = merge_context(event.context, shown)
        row = FeatureRow(record.user_id, event.video_id, record.ts_ms, None, context)
        # Another family's score (an experiment's other arm, or the live family seen by
        # a retrain) is not this model's prediction: scored by this model instead.
        return values, row, item.score if own else np.nan

    def _count(self, outcomes: Counter[str]) -> None:
        for name, n in outcomes.items():
            if n:
                self.counts[name] += n
                if self.outcomes is not None:
                    self.outcomes.labels(name).inc(n)

    def _fits(self, record: ServedRecord) -> bool:
        layout = self.layout
        return (
            record.schema_hash == self.schema_hash
            and len(record.request_values) == len(layout.request_slots)
            and record.item_values.shape[1] == len(layout.item_slots)
        )
