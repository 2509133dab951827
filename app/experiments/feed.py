"""The experiment metrics feed: events joined to the served log's arms, counted per arm.

Where it runs and why: in the serving processes, as a consumer group of the
event log (``{namespace}-experiments``), like the signal feed. The group
splits the partitions among the replicas, so each event is read by one of
them; each replica also reads the served log's matching partitions (the
served log is keyed by user like the events, so one user's responses and
events share a partition number; with different partition counts it reads
all of them) and indexes the responses an experiment's arm ranked:
``recommendation_id`` -> arm, for one attribution window. An event naming
such a response (and its user) is counted for that arm
(:mod:`app.experiments.tally`); other events are skipped without a lookup.

Each partition's checkpoint (offset, log time, totals:
:mod:`app.experiments.checkpoints`) is the position, saved every
``experiments.checkpoint_every_s``; the offsets are committed to the group
after each save only so that the bad records the feed dead-lettered are
behind its commit, and not dead-lettered again by the warm-up re-read below.
A member that gets a partition (start, restart, rebalance) loads its
checkpoint, re-reads one attribution window before it without counting (the
open impressions), and counts from
its offset; so a crash (kill -9 included) or a rebalance neither loses nor
double-counts an event. A partition with no checkpoint starts at the oldest
experiment still counting (running, or ended within a window).

Memory is bounded: the open impressions (``experiments.max_open_exposures``
per process, spread over its partitions), the arm index (at most as many
responses, for one window), and the ids of the last :data:`RECENT_MS` of
responses outside any experiment (to tell "not in the experiment" from "not
read yet"). The feed idles (reads nothing) while no experiment counts.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager

import xxhash

from app.experiments.checkpoints import FeedCheckpoints
from app.experiments.tally import ArmTag, PartitionTally
from feature_store.errors import VidrecError
from feature_store.eventlog.base import ConsumedEvent, ConsumedRecord, EventConsumer, Position
from feature_store.experiments import ExperimentStore
from feature_store.recommendation_ids import logged_response
from feature_store.runtime import tracing
from feature_store.runtime.resources import Resources
from feature_store.runtime.worker import Worker
from feature_store.served import ServedRecord

log = logging.getLogger(__name__)

POLL_RECORDS = 2000
POLL_TIMEOUT_S = 0.1
RETRY_PAUSE_S = 1.0
IDLE_PAUSE_S = 0.5
MARGIN_MS = 30_000
"""Slack for the served record's log time against its events' (the service writes it in
the background, a moment after answering): warm-ups and starts go back this much more."""
RECENT_MS = 30_000
"""Responses outside any experiment are remembered this long (log time), by hash."""
WAIT_S = 0.2
"""Longest a batch waits for the served records of its recent events (produced by the
service a moment after it answered); an id still unknown then counts for no arm."""


def feed_group(resources: Resources) -> str:
    return f"{resources.settings.event_log.topic_namespace}-experiments"


class _ArmIndex:
    """The served log's responses, as far as the feed needs them (bounded)."""

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.arms: OrderedDict[str, ArmTag] = OrderedDict()
        self.others: set[int] = set()
        self._others_order: deque[tuple[int, int]] = deque()
        self.newest = 0
        """Log time of the newest served record read."""

    def add(self, record: ConsumedRecord[ServedRecord]) -> None:
        served = record.event
        self.newest = max(self.newest, record.log_ts)
        if served.arm is None:
            digest = xxhash.xxh64_intdigest(served.recommendation_id.encode())
            self.others.add(digest)
            self._others_order.append((record.log_ts, digest))
            return
        self.arms[served.recommendation_id] = ArmTag(
            served.arm.experiment, served.arm.arm, record.log_ts, served.user_id
        )

    def give_up(self, recommendation_ids: set[str]) -> None:
        """Ids waited for in vain (their response was not logged: a fallback, or dropped):
        remembered like responses outside any experiment, so no later batch waits again."""
        for rec_id in recommendation_ids:
            digest = xxhash.xxh64_intdigest(rec_id.encode())
            self.others.add(digest)
            self._others_order.append((self.newest, digest))

    def knows(self, recommendation_id: str) -> bool:
        return recommendation_id in self.arms or (
            xxhash.xxh64_intdigest(recommendation_id.encode()) in self.others
        )

    def trim(self, now_log_ts: int) -> None:
        arms = self.arms
        oldest = now_log_ts - self.window_ms - MARGIN_MS
        while arms and (
            len(arms) > self.max_entries or next(iter(arms.values())).log_ts < oldest
        ):
            arms.popitem(last=False)
        order = self._others_order
        while order and order[0][0] < self.newest - RECENT_MS:
            self.others.discard(order.popleft()[1])


class ExperimentFeed:
    """A thread consuming the event log into per-arm totals (see the module docstring)."""

    def __init__(
        self, resources: Resources, store: ExperimentStore, checkpoints: FeedCheckpoints
    ) -> None:
        self.resources = resources
        self.store = store
        self.checkpoints = checkpoints
        settings = resources.settings.experiments
        self.window_ms = settings.attribution_window_ms
        self.max_open = settings.max_open_exposures
        self.checkpoint_every_s = settings.checkpoint_every_s
        self.tallies: dict[int, PartitionTally] = {}
        self._committed: dict[int, int] = {}
        """Per partition, the tally offset last committed (or loaded with its checkpoint)."""
        self.last_error: str | None = None
        self.counted = 0
        """Events counted for an arm since start."""
        self._starts: dict[int, int] = {}
        """Per assigned partition, the log time before which its records are skipped."""
        self._assigned: list[int] | None = None
        self._horizon: int | None = None
        self._consumer: EventConsumer | None = None
        self._reader: EventConsumer | None = None
        self._index = _ArmIndex(self.window_ms, self.max_open)
        self._last_save = 0.0
        self._worker = Worker("vidrec-experiments", lambda stop: self._run())
        self._stop = self._worker.stop_event

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.step():
                    self._stop.wait(IDLE_PAUSE_S)
                self.last_error = None
            except (VidrecError, OSError) as exc:
                self.last_error = str(exc)
                log.warning("experiment feed: %s; retrying in %.0f s", exc, RETRY_PAUSE_S)
                self._release(save=False)
                self._stop.wait(RETRY_PAUSE_S)
            except Exception:  # keep counting whatever happens to one batch
                log.exception("experiment feed batch failed")
                self._release(save=False)
                self._stop.wait(RETRY_PAUSE_S)
        try:
            self._release(save=True)
        except (VidrecError, OSError) as exc:
            log.warning("experiment feed: final save failed: %s", exc)

    def _release(self, save: bool) -> None:
        """Save (when asked) and drop the partitions' state; close the consumers."""
        if save and self.tallies:
            self.save()
        self.tallies.clear()
        self._assigned = None
        for consumer in (self._consumer, self._reader):
            if consumer is not None:
                consumer.close()
        self._consumer = self._reader = None

    # --- one step ------------------------------------------------------------------

    def step(self) -> bool:
        """Count one polled batch; False when no experiment is counting (idle)."""
        horizon = self._counting_since()
        if horizon is None:
            if self._consumer is not None:
                self._release(save=True)
            return False
        if self._consumer is None:
            self._consumer = self.resources.event_log.consumer(feed_group(self.resources))
        consumer = self._consumer
        if consumer.assignment() != self._assigned or horizon < (self._horizon or horizon):
            self._follow(consumer, horizon)
        records = consumer.poll(POLL_RECORDS, POLL_TIMEOUT_S)
        if records:
            with tracing.batch_span("experiments.batch", records):
                self._count(records)
        if time.monotonic() - self._last_save >= self.checkpoint_every_s:
            self.save()
        return True

    def _counting_since(self) -> int | None:
        """Log time from which events may count: the oldest experiment still counting."""
        now = int(time.time() * 1000)
        starts = [
            e.started_at_ms
            for e in self.store.all()
            if e.status == "running"
            or (e.ended_at_ms or 0) + self.window_ms + MARGIN_MS >= now
        ]
        return min(starts) - MARGIN_MS if starts else None

    def _follow(self, consumer: EventConsumer, horizon: int) -> None:
        """Take the current assignment: load each partition's checkpoint, seek back for the
        warm-up, and read the matching served partitions from there."""
        if self.tallies:
            self.save()
        assigned = consumer.assignment() or consumer.wait_for_assignment(5.0)
        saved = self.checkpoints.load()
        per_partition = max(1, self.max_open // max(1, len(assigned)))
        self.tallies, self._starts = {}, {}
        for partition in assigned:
            tally = PartitionTally(self.window_ms, per_partition)
            state = saved.get(partition)
            if state is not None:
                tally.restore(state)
            if tally.offset is not None and tally.log_ts >= horizon:
                self._starts[partition] = tally.log_ts - self.window_ms - MARGIN_MS
            else:  # nothing counted since the horizon: count from it (totals kept)
                tally.offset = None
                self._starts[partition] = horizon
            self.tallies[partition] = tally
        self._assigned, self._horizon = assigned, horizon
        self._committed = {p: t.offset for p, t in self.tallies.items() if t.offset is not None}
        start = min(self._starts.values(), default=horizon)
        consumer.seek_to_timestamp(max(0, start))
        self._follow_served(assigned, start)

    def _follow_served(self, assigned: list[int], start_ts: int) -> None:
        served_log = self.resources.served_log
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if served_log is None:
            return
        aligned = served_log.partition_count() == self.resources.event_log.partition_count()
        self._reader = served_log.reader(assigned if aligned else None)
        self._reader.seek_to_timestamp(max(0, start_ts - self.window_ms - MARGIN_MS))
        self._index = _ArmIndex(self.window_ms, self.max_open)

    # --- counting ------------------------------------------------------------------

    def _catch_up(self, timeout_s: float = 0.0) -> None:
        reader = self._reader
        if reader is None:
            return
        while True:
            got = reader.poll(POLL_RECORDS, timeout_s)
            for record in got:
                self._index.add(record)  # type: ignore[arg-type]
            if len(got) < POLL_RECORDS:
                return

    def _count(self, records: list[ConsumedEvent]) -> None:
        self._catch_up()
        self._await_served(records)
        newest: dict[int, int] = {}
        for record in records:
            tally = self.tallies.get(record.partition)
            if tally is None or record.log_ts < self._starts.get(record.partition, 0):
                continue
            self._count_one(tally, record)
            newest[record.partition] = record.log_ts
        for partition, log_ts in newest.items():
            self.tallies[partition].expire(log_ts)
        if newest:
            self._index.trim(min(newest.values()))

    def _await_served(self, records: list[ConsumedEvent]) -> None:
        """Wait (once, at most ``WAIT_S``) for the served records of recent events whose
        response this feed has not read yet; past that, their ids are given up."""
        index = self._index
        now_ms = int(time.time() * 1000)
        wanted = {  # a fallback's id has no record to wait for (its id says so)
            rec_id for r in records
            if (rec_id := r.event.recommendation_id) is not None
            and logged_response(rec_id)
            and not index.knows(rec_id)
            and r.log_ts >= now_ms - RECENT_MS
        }
        if not wanted:
            return
        deadline = time.monotonic() + WAIT_S
        while wanted and time.monotonic() < deadline:
            self._catch_up(0.02)
            wanted = {rec_id for rec_id in wanted if not index.knows(rec_id)}
        index.give_up(wanted)

    def _count_one(self, tally: PartitionTally, record: ConsumedEvent) -> None:
        """One record into its partition's tally (counted when past the checkpoint)."""
        live = tally.offset is None or record.offset >= tally.offset
        event = record.event
        rec_id = event.recommendation_id
        tag = self._index.arms.get(rec_id) if rec_id is not None else None
        if tag is not None and tag.user_id == event.user_id:
            tally.apply(event, record.log_ts, tag, live)
            self.counted += live
        if live:
            tally.offset = record.offset + 1
            tally.log_ts = record.log_ts

    def save(self) -> None:
        """Checkpoint every partition this feed holds (totals of experiments still in the
        book only: the book keeps the newest ended ones)."""
        keep = {e.id for e in self.store.all()}
        self.checkpoints.save({p: t.state(keep) for p, t in self.tallies.items()})
        self._last_save = time.monotonic()
        consumer = self._consumer
        if consumer is None:
            return
        # Only offsets that moved since they were last committed (or loaded): the consumer
        # moves a commit past the bad records right after it, and the same offset committed
        # again would move the group back onto them.
        owned = set(consumer.assignment())
        moved = {
            p: t.offset
            for p, t in sorted(self.tallies.items())
            if t.offset is not None and p in owned and t.offset != self._committed.get(p)
        }
        try:  # past the dead-lettered records (module doc); the checkpoint is the position
            consumer.commit([Position(p, o) for p, o in moved.items()])
            self._committed.update(moved)
        except VidrecError as exc:
            log.warning("experiment feed: commit after the checkpoint failed: %s", exc)

    def status(self) -> dict[str, object]:
        return {
            "partitions": sorted(self.tallies),
            "counted": self.counted,
            "open": sum(len(t.open) for t in self.tallies.values()),
            "late": sum(t.late for t in self.tallies.values()),
            "evicted": sum(t.evicted for t in self.tallies.values()),
            "last_error": self.last_error,
        }


@contextmanager
def run_experiment_feed(
    resources: Resources, store: ExperimentStore, checkpoints: FeedCheckpoints
) -> Iterator[ExperimentFeed]:
    feed = ExperimentFeed(resources, store, checkpoints)
    feed.start()
    try:
        yield feed
    finally:
        feed.close()
