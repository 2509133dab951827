"""The trainer's side of the served log: impressions trained on the features they were served with.

The service logs what it recommended with the feature values it scored
(:mod:`feature_store.served`); clients send the ``recommendation_id`` back on
their events. Before each batch the trainer reads the served log up to the
batch's log time and keeps the records in a bounded index; an impression
carrying a ``recommendation_id`` found there, for the same user, a video of
that response and the trainer's schema, takes the served item's values and
score as the values of its shown moment (:mod:`trainer.labels`). Anything
else (no id, a record dropped by the service or not read yet, another
schema) is featurised from the stores as the impression arrives, and
counted, so the share of served joins is visible (``status()["served"]``).

One refinement of "as served": columns computed per request from the
request's context (position, surface, device...) are recomputed with the
impression's context laid over the request's, and the served position where
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
import time
from collections import OrderedDict
from typing import cast

import numpy as np
import numpy.typing as npt

from feature_store.eventlog.base import ConsumedRecord, EventConsumer, EventLog
from feature_store.events import Event
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.sources import SOURCES
from feature_store.registry import family_of
from feature_store.served import ServedRecord
from feature_store.settings import ServedLogSettings
from trainer.labels import merge_context

log = logging.getLogger(__name__)

_POLL = 2000
WAIT_S = 0.1
"""Longest a batch waits for served records its impressions name but the trainer has not
read yet (a Kafka reader fetches in round trips). An id waited for in vain (the service
dropped its record) is not waited for again."""
_GIVEN_UP_MAX = 100_000
_LOOKAHEAD_MS = 5_000
"""Served records are read this far past a batch's newest event (clock skew between the
service instances that produced them)."""


class ServedJoin:
    """A bounded index of served records, read from the served log (see the module doc)."""

    def __init__(
        self,
        served_log: EventLog,
        settings: ServedLogSettings,
        extractor: FeatureExtractor,
        family: str = "main",
    ) -> None:
        self.log = served_log
        self.window_ms = settings.join_window_ms
        self.max_records = settings.join_max_records
        self.extractor = extractor
        self.family = family
        """This trainer's model family: served scores of its own versions are its
        predictions as shown; another family's are not (see :meth:`moments`)."""
        self.layout = extractor.layout
        self.schema_hash = extractor.schema.schema_hash()
        self._records: OrderedDict[str, tuple[ServedRecord, int]] = OrderedDict()
        """recommendation_id -> (record, log time), oldest first."""
        self._given_up: OrderedDict[str, None] = OrderedDict()
        """Recommendation ids waited for in vain (dropped by the service, or too old): later
        batches naming them do not wait again."""
        self._reader: EventConsumer | None = None
        self._partitions: list[int] | None = None
        self._context_columns = [
            (j, col)
            for j, col in enumerate(extractor.schema.categorical)
            if SOURCES[col.source].per_request
        ]
        self.joined = 0
        """Impressions trained on the values they were served with."""
        self.missing = 0
        """Impressions naming a recommendation not (or no longer) in the index."""
        self.mismatched = 0
        """Impressions whose record is of another user, video or schema."""

    def status(self) -> dict[str, int]:
        return {
            "joined": self.joined,
            "missing": self.missing,
            "mismatched": self.mismatched,
            "held": len(self._records),
        }

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    # --- reading -----------------------------------------------------------

    def follow(self, partitions: list[int] | None, resume_ts: int | None) -> None:
        """Read the served partitions matching the events ``partitions`` (None: all).

        A new reader starts ``join_window_ms`` before ``resume_ts`` (the log time
        the trainer resumes its events at), or at the start (None).
        """
        if self._reader is not None and partitions == self._partitions:
            return
        self.close()
        self._reader = self.log.reader(partitions)
        self._partitions = partitions
        if resume_ts is not None:
            self._reader.seek_to_timestamp(max(0, resume_ts - self.window_ms))

    def catch_up(self, until_log_ts: int) -> None:
        """Index the served records already fetched, up to ``until_log_ts`` (a batch's newest
        event) and a little past; forget those older than the join window.

        Never waits: a record not fetched yet is waited for by :meth:`moments`, and only
        when an impression names it.
        """
        while True:
            got = self._poll(0.0)
            if len(got) < _POLL or got[-1].log_ts > until_log_ts + _LOOKAHEAD_MS:
                break
        oldest = until_log_ts - self.window_ms
        records = self._records
        while records and (
            len(records) > self.max_records or next(iter(records.values()))[1] < oldest
        ):
            records.popitem(last=False)

    def _poll(self, timeout_s: float) -> list[ConsumedRecord[ServedRecord]]:
        if self._reader is None:
            self.follow(None, None)
        assert self._reader is not None
        got = cast(list[ConsumedRecord[ServedRecord]], self._reader.poll(_POLL, timeout_s))
        for record in got:
            served = record.event
            self._records.pop(served.recommendation_id, None)
            self._records[served.recommendation_id] = (served, record.log_ts)
        return got

    def _wait_for(self, wanted: set[str]) -> None:
        """Read on until every id of ``wanted`` is indexed or :data:`WAIT_S` passed."""
        deadline = time.monotonic() + WAIT_S
        while wanted.difference(self._records):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._poll(min(remaining, 0.02))

    # --- joining -----------------------------------------------------------

    def moments(
        self, events: list[Event]
    ) -> tuple[list[int], npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
        """For ``events`` (impressions), which were served here and the values and scores
        they were served with: ``(positions, (n, W) values, (n,) scores)``."""
        wanted = {e.recommendation_id for e in events if e.recommendation_id is not None}
        unread = wanted.difference(self._records).difference(self._given_up)
        if unread:
            self._wait_for(unread)
            for unread_id in unread.difference(self._records):
                self._given_up[unread_id] = None
            while len(self._given_up) > _GIVEN_UP_MAX:
                self._given_up.popitem(last=False)
        found: list[int] = []
        rows: list[npt.NDArray[np.uint64]] = []
        scores: list[float] = []
        contexts: list[FeatureRow] = []
        for i, event in enumerate(events):
            rec_id = event.recommendation_id
            if rec_id is None:
                continue
            entry = self._records.get(rec_id)
            if entry is None:
                self.missing += 1
                continue
            record = entry[0]
            at = record.position_of(event.video_id)
            if at is None or not self._usable(record, event):
                self.mismatched += 1
                continue
            item = record.items[at]
            own = record.model_version is not None and (
                family_of(record.model_version) == self.family
            )
            values = np.empty(self.layout.width, dtype=np.uint64)
            values[self.layout.request_slots] = record.request_values
            values[self.layout.item_slots] = record.item_values[at]
            shown = record.context.model_copy(update={"position": item.position})
            context = merge_context(event.context, shown)
            contexts.append(FeatureRow(record.user_id, event.video_id, record.ts_ms, None, context))
            found.append(i)
            rows.append(values)
            # Another family's score (an experiment's other arm, or the live family seen by
            # a retrain) is not this model's prediction: scored by this model instead.
            scores.append(item.score if own else np.nan)
        self.joined += len(found)
        if not found:
            return [], np.zeros((0, self.layout.width), np.uint64), np.zeros(0)
        packed = np.stack(rows)
        for j, col in self._context_columns:
            packed[:, j] = self.extractor.keys(col, contexts)
        return found, packed, np.array(scores)

    def _usable(self, record: ServedRecord, event: Event) -> bool:
        layout = self.layout
        return (
            record.user_id == event.user_id
            and record.schema_hash == self.schema_hash
            and len(record.request_values) == len(layout.request_slots)
            and record.item_values.shape[1] == len(layout.item_slots)
        )

