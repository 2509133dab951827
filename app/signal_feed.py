"""The signal feed: keeps serving's state current from the event log, with or without a trainer.

A consumer in its own group (``{namespace}-signals``) reads every event,
looks up the users' recent histories (one round trip), calls
:meth:`~feature_store.signals.base.CandidateSignals.record` (trending,
co-visitation), then records the events into serving's activity store
(``Resources.activity``: the histories behind ``exclude_seen`` and the
history features, the video counters behind the counter features and cold
start), then commits. So a watched video is excluded, and the history
features move, as soon as the feed has read the event (well under a second),
whether the trainer runs, lags, is paused or is gone. The trainer keeps its
own copy for its point-in-time features (``Resources.training_activity``):
this feed running ahead of it never leaks into training.
It runs in the service process (``vidrec up`` and each ``vidrec serve``):
the group splits partitions among the serving processes, so each event is
recorded once (at least once across a crash: a replayed batch adds its counts
again, which trending, co-visitation and serving's counters tolerate; a
history takes an event once however often it is replayed). Independent of the
trainer, so candidate freshness does not wait for training steps.

The same pass keeps the users' feedback
(:mod:`feature_store.signals.feedback`): an engagement clears the video
from the user's served-without-engagement set, a dislike is noted with the
video's creator, a positive engagement takes its creator off the user's
disliked creators (one catalog read per batch for those videos).

Disable with ``api.signal_feed = false`` where another process records the
signals. A failing backend is logged and retried after a pause; the feed
never takes the service down.

Embedded (in-process signals and stores, snapshotted under the data
directory) they live in memory, so committing each batch would let a kill -9
lose every count since the last snapshot: the feed would never read those
events again. There the feed snapshots the signals (and serving's activity)
every :data:`SNAPSHOT_EVERY_S` and commits only then, after the snapshot: a
restart replays the events recorded after it (some counted twice at worst,
never lost).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from feature_store.errors import VidrecError
from feature_store.event_types import of_types
from feature_store.eventlog.base import ConsumedEvent, EventConsumer
from feature_store.runtime.resources import Resources
from feature_store.runtime.worker import Worker
from feature_store.signals.base import CandidateSignals
from feature_store.signals.feedback import MemoryFeedback, UserFeedback
from feature_store.signals.feedback.base import needs_creator

log = logging.getLogger(__name__)

POLL_RECORDS = 2000
POLL_TIMEOUT_S = 0.1
"""Longest wait for the first record of a poll: bounds the feed's added latency."""
RETRY_PAUSE_S = 1.0
SNAPSHOT_EVERY_S = 10.0
"""Embedded: seconds between snapshots of the signals (each followed by a commit)."""
_ENTERS = of_types("enters_history")
"""Event types that may make a history entry (others need no catalog read)."""


def feed_group(resources: Resources) -> str:
    return f"{resources.settings.event_log.topic_namespace}-signals"


class SignalFeed:
    """A thread consuming the event log into the candidate signals."""

    def __init__(
        self, resources: Resources, signals: CandidateSignals, feedback: UserFeedback,
        snapshots: bool = True,
    ) -> None:
        """``snapshots=False``: never snapshot in-process signals (a throwaway replay such
        as ``vidrec eval``, whose state dies with it; each commit is then immediate)."""
        self.resources = resources
        self.signals = signals
        self.feedback = feedback
        """Per-user feedback: engagements clear served entries, dislikes are noted."""
        self.recorded = 0
        """Events recorded since start."""
        self.last_error: str | None = None
        snapshot_dir = getattr(signals, "snapshot_dir", None)
        self._snapshot_dir: Path | None = (
            snapshot_dir if snapshots and isinstance(snapshot_dir, Path) else None
        )
        """Where in-process signals are snapshotted (then the feed commits after each)."""
        self._next_snapshot = time.monotonic() + SNAPSHOT_EVERY_S
        self._uncommitted = False
        self._failed: list[ConsumedEvent] = []
        """A polled batch not recorded yet (its step failed): the next step's."""
        self._worker = Worker("vidrec-signal-feed", lambda stop: self._run())
        self._stop = self._worker.stop_event

    def start(self) -> None:
        self._worker.start()

    def _run(self) -> None:
        consumer: EventConsumer | None = None
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = self.resources.event_log.consumer(feed_group(self.resources))
                self.step(consumer)
                self.last_error = None
            except (VidrecError, OSError) as exc:
                self.last_error = str(exc)
                log.warning("signal feed: %s; retrying in %.0f s", exc, RETRY_PAUSE_S)
                self._stop.wait(RETRY_PAUSE_S)
            except Exception:  # keep feeding whatever happens to one batch
                log.exception("signal feed batch failed")
                self._stop.wait(RETRY_PAUSE_S)
        if consumer is not None:
            try:
                self._commit(consumer, final=True)
            except (VidrecError, OSError) as exc:
                log.warning("signal feed: final commit failed: %s", exc)
            consumer.close()

    def step(self, consumer: EventConsumer) -> int:
        """Record one polled batch; returns how many events it held.

        A batch that failed (a backend down) is recorded again by the next step before
        anything new is polled: the consumer's position is past it already, so dropping
        it would lose those events from serving's state until a restart re-read them.
        What it had recorded before failing counts twice (at least once, as after a crash).
        """
        dead_before = consumer.dead_lettered
        records = self._failed or consumer.poll(POLL_RECORDS, POLL_TIMEOUT_S)
        self._failed = records  # until recorded
        if records:
            events = [r.event for r in records]
            activity = self.resources.activity
            users = list(dict.fromkeys(e.user_id for e in events))
            histories = dict(zip(users, activity.histories(users), strict=True))
            self.signals.record(events, histories)
            # The catalog records of what may enter a history (its length, creator and
            # category go in the entry) and of what the feedback needs a creator for.
            wanted = list({e.video_id for e in events if e.type in _ENTERS})
            found = self.resources.catalog.get_many(wanted)
            videos = {v.video_id: v for v in found if v is not None}
            ratio = self.resources.settings.features.positive_watch_ratio
            creators = {
                e.video_id: videos[e.video_id].creator_id
                for e in events if e.video_id in videos and needs_creator(e, ratio)
            }
            self.feedback.record_events(events, creators)
            activity.record(events, videos)
            self.recorded += len(events)
        self._failed = []
        if records or consumer.dead_lettered != dead_before:  # past bad records too
            self._uncommitted = True
        self._commit(consumer)
        return len(records)

    def _commit(self, consumer: EventConsumer, final: bool = False) -> None:
        """Commit what was recorded: at once, or (in-process signals) after a snapshot;
        never past a batch that failed (a restart re-reads it)."""
        if not self._uncommitted or self._failed:
            return
        if self._snapshot_dir is not None:
            if not final and time.monotonic() < self._next_snapshot:
                return
            self.signals.snapshot(self._snapshot_dir)
            if isinstance(self.feedback, MemoryFeedback) and self.feedback.snapshot_dir:
                self.feedback.snapshot(self.feedback.snapshot_dir)
            if self.resources.settings.stores.backend == "memory":
                self.resources.activity.snapshot(self.resources.data_dir / "activity")
            self._next_snapshot = time.monotonic() + SNAPSHOT_EVERY_S
        consumer.commit()
        self._uncommitted = False

    def close(self) -> None:
        self._worker.stop()


@contextmanager
def run_signal_feed(
    resources: Resources, signals: CandidateSignals, feedback: UserFeedback
) -> Iterator[SignalFeed]:
    feed = SignalFeed(resources, signals, feedback)
    feed.start()
    try:
        yield feed
    finally:
        feed.close()
