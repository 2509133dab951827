"""The service's side of the served log: every model-ranked response, written in the background.

A recommend request hands :meth:`ServedLogWriter.record` what it already has
(the ids, scores, and the batch of features it scored); ``record`` packs the
served items' values into the record (:meth:`ServedLogWriter.to_record`, about
0.16 ms for 20 items) and queues it; encoding and producing happen on the
writer's thread (:mod:`feature_store.served` says what a record holds). The
queue between the two is bounded: when it is full, when a record cannot be
packed, or when the log is unavailable, records are dropped and counted
(``vidrec_served_log_records_total{outcome="dropped"|"failed"}``), so the
served log never adds a failure mode, nor a wait, to recommend. Impressions
whose record was lost are featurised by the trainer from the stores as they
arrive instead (still point in time).

Why the packing is the request's and the writer drains every
:data:`WRITE_EVERY_S` (50 ms): the writer's Python work takes the GIL from the
requests. Against a server without the log, on ``bench_serving``'s data
(sequential, 500 given candidates, alternating servers), packing on the
writer's thread drained every 5 ms added 0.96 ms of server CPU per request
and 0.6 ms to the p50 (means of four runs); packing in the request and
draining every 50 ms added 0.26 ms and 0.15 ms (three runs). Paired against
the tree before in ``bench_serving --baseline-tree``: 0.33 ms less CPU per
request, p50 within noise (``docs/benchmarks.md``, *The served log's cost*).
A request's ``record`` is then one packing and one append, with no
condition to notify (a notified writer woke at once and took the GIL from the
end of the very request that queued the record, issue #24). The delay this
adds before a record is on the log is far inside the trainer's
``served_log.join_lookahead_ms``; so is the delay before a response's items
count as served for ``exclude_served``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.metrics import Metrics
from feature_store.eventlog.base import EventLog
from feature_store.events import EventContext
from feature_store.features.batch import BatchFeatures, Indices
from feature_store.features.values import ValueLayout, split_from_batch
from feature_store.runtime.worker import Worker
from feature_store.served import ServedArm, ServedItems, ServedRecord
from feature_store.settings import ServedLogSettings
from feature_store.signals.feedback.base import ServedBatch, UserFeedback

log = logging.getLogger(__name__)

_BATCH = 256
"""Records produced per call to the log (one round trip to Kafka)."""
WRITE_EVERY_S = 0.05
"""How often the writer drains the queue, in seconds (see the module docstring)."""


@dataclass(frozen=True)
class Served:
    """A response as the request left it: references only, nothing packed or encoded yet."""

    recommendation_id: str
    user_id: str
    ts_ms: int
    model_version: str
    context: EventContext
    video_ids: Sequence[str]
    """Every candidate scored, in the order of ``features``' rows."""
    sources: Sequence[str]
    scores: np.ndarray
    order: Indices
    """Rows of the served items, best first (the response's items)."""
    features: BatchFeatures
    arm: ServedArm | None = None
    """The experiment arm whose model ranked it, if any."""


class ServedLogWriter:
    """Bounded queue plus one writer thread (see the module docstring). A context manager."""

    def __init__(
        self,
        served_log: EventLog,
        settings: ServedLogSettings,
        layout: ValueLayout,
        metrics: Metrics,
        feedback: UserFeedback | None = None,
    ) -> None:
        self.log = served_log
        self.feedback = feedback
        """Where each response's items are noted as served (:mod:`app.rerank`'s
        ``exclude_served`` reads them); None: nowhere."""
        self.max_items = settings.max_items
        self.layout = layout
        self.schema_hash = layout.schema.schema_hash()
        self.outcomes = metrics.served_log_records
        self._queue: deque[tuple[ServedBatch, ServedRecord]] = deque()
        """Appended by requests, popped by the writer (both atomic on a deque): each
        response's items as served, and its packed record."""
        self._capacity = settings.queue_records
        self._worker = Worker("vidrec-served-log", self._run)
        self._last_warning = 0.0

    def __enter__(self) -> ServedLogWriter:
        self._worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, served: Served) -> None:
        """Pack ``served`` and queue it for writing; drops it (counted) if the queue is full
        (concurrent requests may overfill it by one record each: the bound is on memory,
        not exact) or if it cannot be packed (logged: a bug must not fail the request)."""
        if len(self._queue) >= self._capacity:
            self.outcomes.labels("dropped").inc()
            return
        try:
            packed = self.to_record(served)
        except Exception:
            self.outcomes.labels("failed").inc()
            if self._warning_due():
                log.exception("served log: a record could not be packed; dropped")
            return
        items = [served.video_ids[r] for r in served.order.tolist()]
        self._queue.append((ServedBatch(served.user_id, served.ts_ms, items), packed))

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop the thread."""
        self._worker.stop(timeout_s)

    def _run(self, stop: threading.Event) -> None:
        pending = self._queue
        while True:
            stopping = stop.wait(WRITE_EVERY_S)
            while pending:
                batch = [pending.popleft() for _ in range(min(_BATCH, len(pending)))]
                self._write(batch)
            if stopping:
                return

    def _write(self, pending: list[tuple[ServedBatch, ServedRecord]]) -> None:
        self._note_served([served for served, _ in pending])
        records = [record for _, record in pending]
        try:
            self.log.produce(records)
        except Exception as exc:  # the log is down (or a bug): count, say so, go on
            self.outcomes.labels("failed").inc(len(pending))
            if self._warning_due():
                log.warning("served log: %d records not written: %r", len(pending), exc)
            return
        self.outcomes.labels("written").inc(len(records))

    def _note_served(self, pending: list[ServedBatch]) -> None:
        """Tell the feedback store what was served (every item of each response)."""
        if self.feedback is None:
            return
        try:
            self.feedback.record_served(pending)
        except Exception as exc:  # exclusion is best effort: the log still gets its records
            if self._warning_due():
                log.warning("served log: %d responses not noted as served: %r", len(pending), exc)

    def _warning_due(self) -> bool:
        """Whether a warning may be logged now: one per 10 s at most, whatever failed."""
        now = time.monotonic()
        if now - self._last_warning <= 10.0:
            return False
        self._last_warning = now
        return True

    def to_record(self, served: Served) -> ServedRecord:
        """The record of ``served``: its top ``max_items`` items and their packed values."""
        rows = served.order[: self.max_items]
        request, values = split_from_batch(self.layout, served.features, rows)
        at, ids, sources = rows.tolist(), served.video_ids, served.sources
        items = ServedItems(  # position k: the k-th item of the response
            [ids[r] for r in at], np.arange(len(at)), served.scores[rows], [sources[r] for r in at]
        )
        return ServedRecord(
            recommendation_id=served.recommendation_id,
            user_id=served.user_id,
            ts_ms=served.ts_ms,
            model_version=served.model_version,
            schema_hash=self.schema_hash,
            context=served.context,
            items=items,
            request_values=request,
            item_values=values,
            arm=served.arm,
        )
