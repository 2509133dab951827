"""Join: label the batch's events, each sample with the feature values of its moment.

Owns the label joiner (:class:`~trainer.labels.Joiner`: the impressions
waiting for a response, their values, the per-partition event-time
watermarks, and the watch head's quantiles; ``joiner``, ``watch_quantiles``
and ``shown.npy`` in a checkpoint) and the served log's index
(:class:`~trainer.served.ServedJoin`, its reader thread; ``served_join`` in
a checkpoint), which it closes.

The moment of a sample is when its video was shown (:mod:`trainer.labels`):
moments the service logged take the values and score it served them with;
every other one is featurised from the stores' pre-batch state
(:mod:`trainer.samples`) and, for an impression, scored by the current
ranker: the prediction as the video was shown.

An idle batch resolves, instead, the impressions older than the join window
at the batch's clock (:meth:`~trainer.labels.Joiner.flush_idle`), so the
impressions at the end of a stream do not wait forever.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from feature_store.event_types import of_types
from feature_store.eventlog.base import ConsumedEvent, EventConsumer
from feature_store.events import Event
from feature_store.features.values import FeatureValues
from feature_store.runtime.resources import Resources
from trainer.checkpoint import SHOWN_FILE
from trainer.labels import Joiner, Moments
from trainer.samples import Lookup, featurise
from trainer.served import ServedJoin
from trainer.stages.base import Batch, Checkpoint, Progress, Shared
from trainer.step import Trainer

log = logging.getLogger(__name__)

SHOWN = of_types("shows")
"""Impressions: the moments the current model scores as shown."""


class Join:
    """Fills :attr:`Batch.lookup` and :attr:`Batch.samples`."""

    def __init__(
        self,
        resources: Resources,
        joiner: Joiner,
        ranker: Trainer,
        served: ServedJoin | None,
        progress: Progress,
        shared: Shared,
    ) -> None:
        self.resources = resources
        self.joiner = joiner
        self.ranker = ranker
        """Scores the impressions nobody served (under :attr:`Shared.lock`)."""
        self.served = served
        """The served log's index (:mod:`trainer.served`), when there is a served log."""
        self.shared = shared
        self._served_aligned: bool | None = None
        """Whether the served topic has the events topic's partition count (then this
        trainer reads only the served partitions of its own users)."""
        self.progress = progress
        """The record stage's: where each partition's served log is resumed."""

    def process(self, batch: Batch) -> Batch:
        if batch.idle_ms is not None:
            batch.samples = self.joiner.flush_idle(batch.idle_ms)
            return batch
        retry = self.shared.retry
        events, partitions, log_times = batch.events, batch.partitions, batch.log_times
        lookup = retry(lambda: Lookup(self.resources.catalog, events))
        batch.lookup = lookup
        consumer = batch.consumer
        if self.served is not None and batch.records and consumer is not None:
            records = batch.records  # the broker may still be starting: retried
            retry(lambda: self._follow_served(consumer, records))

        def moments(positions: list[int]) -> Moments:
            return self.moments(
                [events[i] for i in positions],
                lookup,
                [partitions[i] for i in positions],
                [log_times[i] for i in positions],
            )

        # observe calls moments before it changes any state: a retry is clean.
        batch.samples = retry(
            lambda: self.joiner.observe(events, partitions, lookup.durations, moments)
        )
        return batch

    def moments(
        self,
        events: list[Event],
        lookup: Lookup,
        partitions: list[int] | None = None,
        log_times: list[int] | None = None,
    ) -> Moments:
        """What is known of ``events``' moments (:class:`~trainer.labels.Moments`).

        Moments the service logged (an impression, or an engagement no
        impression preceded, naming its response) take the values and score
        they were served with (:mod:`trainer.served`; ``partitions`` and
        ``log_times`` say where and when each event was read); every other
        moment is featurised from the stores' pre-batch state, and other
        impressions are scored by the current model: the prediction as the
        video was shown.
        """
        layout = self.ranker.extractor.layout
        values = np.zeros((len(events), layout.width), dtype=np.uint64)
        scores = np.full(len(events), np.nan)
        shown = [i for i, e in enumerate(events) if e.type in SHOWN]
        named = [i for i, e in enumerate(events) if e.recommendation_id is not None]
        served: list[int] = []
        if self.served is not None and named:
            found, served_values, served_scores = self.served.moments(
                [events[i] for i in named],
                None if partitions is None else [partitions[i] for i in named],
                None if log_times is None else [log_times[i] for i in named],
            )
            served = [named[i] for i in found]
            values[served] = served_values
            scores[served] = served_scores
        rest = sorted(set(range(len(events))) - set(served))
        if rest:
            values[rest] = featurise(
                self.ranker.extractor,
                [events[i] for i in rest],
                lookup,
                self.resources.training_activity,
            )
        unscored = [i for i in shown if np.isnan(scores[i])]  # not served, or by another family
        if unscored:
            batch = FeatureValues(layout, values[unscored]).to_batch()
            with self.shared.lock:
                scores[unscored] = self.ranker.score(batch)
        return Moments(values, scores)

    def _follow_served(self, consumer: EventConsumer, records: list[ConsumedEvent]) -> None:
        """Read the served partitions of the events partitions this trainer owns now, from
        where it resumed them (its checkpoint's log times, else this batch's oldest)."""
        served = self.served
        if served is None:
            return
        if self._served_aligned is None:
            served_log = self.resources.served_log
            assert served_log is not None
            events = self.resources.event_log.partition_count()
            self._served_aligned = served_log.partition_count() == events
        assignment = consumer.assignment()
        log_times = self.progress.log_times
        resume = min(
            (log_times[p] for p in assignment if p in log_times),
            default=min(r.log_ts for r in records),
        )
        aligned = self._served_aligned
        served.follow(assignment if aligned else None, resume, aligned=aligned)

    def status(self) -> dict[str, Any] | None:
        return None if self.served is None else self.served.status()

    def trained_to(self, log_ts: int) -> None:
        """The served log may forget what is older than the window before ``log_ts``."""
        if self.served is not None:
            self.served.trained_to(log_ts)

    def save(self, checkpoint: Checkpoint) -> None:
        joiner, shown = self.joiner.state()
        np.save(checkpoint.directory / SHOWN_FILE, shown)
        checkpoint.state["joiner"] = joiner
        checkpoint.state["watch_quantiles"] = self.joiner.policy.watch.state()
        checkpoint.state["served_join"] = (
            None if self.served is None else dict(self.served.counts)
        )

    def restore(self, checkpoint: Checkpoint | None) -> None:
        """The pending impressions (dropped when written for another schema: their packed
        values mean something else), the watch head's quantiles, the served-join counts."""
        if checkpoint is None:
            return
        state = checkpoint.state
        shown_file = checkpoint.directory / SHOWN_FILE
        shown = np.load(shown_file) if shown_file.is_file() else np.zeros((0, 0), np.uint64)
        if not checkpoint.same_schema:
            shown = np.zeros((0, 0), np.uint64)
        self.joiner.load_state(state.get("joiner", {}) if len(shown) else {}, shown)
        if "watch_quantiles" in state:
            self.joiner.policy.watch.load_state(state["watch_quantiles"])
        if self.served is not None and state.get("served_join"):
            self.served.load_counts(state["served_join"])

    def close(self) -> None:
        if self.served is not None:
            self.served.close()
