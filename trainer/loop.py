"""The online training loop: poll, run the stages, checkpoint, commit.

One iteration::

    poll up to batch_size events (waiting at most max_wait_ms)
    run them through the stages (trainer.stages.pipeline):
      decode: drop event ids already trained (dedupe window)
      join:   join impressions, label events (trainer.labels); feature values
              of the moments shown, from the stores' pre-batch state
      rank:   pull -> forward (prequential scores) -> backward -> push ->
              dense step; record the events into its own activity store
      record: positions, journal line; towers: their steps; export: counts
    (a full max_wait with nothing to read: an idle batch, which resolves the
    impressions older than the join window by wall clock)
    every checkpoint_every_s: checkpoint (each stage's part), then commit
    the offsets it covers

The loop owns the thread, the control requests (pause, export now, stop),
the periodic work (metrics points, exports, dense averaging, checkpoints)
and the retry; each stage owns its state (:mod:`trainer.stages.base`).

Delivery guarantees (see ``docs/training.md`` for the full argument):

- **At least once.** Offsets are committed only after a checkpoint that
  contains everything trained up to them is durable, so every event whose
  offset is committed is in the restored state, and every other one is
  redelivered.
- **No event trained twice**, with the embedded (memory) sparse tables: a
  checkpoint holds the dense network, its optimizer, the sparse tables, the
  activity store, the joiner and the dedupe window, as one atomic unit. A
  crash (even SIGKILL) rolls the whole state back to the last checkpoint
  and the log replays from there, so each event is applied once to the
  state that survives. Events between the committed offset and the
  checkpoint's (a crash after the checkpoint but before the commit) are
  skipped by the restored dedupe window.
- With Redis sparse tables, pushes are durable the moment they happen and
  cannot be rolled back. Each batch's event ids are appended to a journal
  right after its push, dense step and activity record (the push runs
  beside the other two, see :mod:`trainer.step`, and the line waits for
  it); a restart adds the journal's ids to
  the dedupe window, so redelivered events that were already pushed are
  skipped. The remaining gap is a crash between a batch's push and its
  journal line (one batch, milliseconds): that batch's rows get its
  gradient twice. Dense updates since the last checkpoint are lost (the
  network resumes from the checkpoint).
- Several trainers in one group (Redis tables): each batch claims its
  partitions and reads the group's progress under the claim, writes only while
  the claim is its own, and raises the progress as it releases the claim
  (:mod:`trainer.distributed`), so a member that loses a partition in a
  rebalance mid-batch and the partition's new owner never both train a
  record. A record given back (its partition busy with another member's
  batch) is sought again and counted when it trains.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from queue import Empty, SimpleQueue
from typing import Any, Literal, TypeVar

import torch
from prometheus_client import CollectorRegistry

from feature_store.errors import BackendUnavailable, Conflict
from feature_store.eventlog.base import ConsumedEvent, EventConsumer, Position
from feature_store.ops.timeseries import MetricsSeries
from feature_store.runtime import tracing
from feature_store.runtime.resources import Resources
from trainer.checkpoint import STATE_FILE, Checkpointer
from trainer.distributed import PartitionsBusy, open_group_sync
from trainer.fetch import IDLE, Fetcher
from trainer.metrics import TrainerMetrics
from trainer.model import WideDeep
from trainer.retrieval import RetrievalTrainer
from trainer.stages.base import Batch, Checkpoint, Shared
from trainer.stages.pipeline import build
from trainer.stages.rank import OnScored

log = logging.getLogger(__name__)

T = TypeVar("T")

_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class OnlineTrainer:
    """The loop; :class:`trainer.component.TrainerComponent` drives it."""

    def __init__(
        self,
        resources: Resources,
        *,
        registry: CollectorRegistry | None = None,
        series: MetricsSeries | None = None,
        on_scored: OnScored | None = None,
    ) -> None:
        settings = resources.settings
        cfg = settings.trainer
        self.resources = resources
        self.cfg = cfg
        self.schema = resources.schema
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.metrics = TrainerMetrics(cfg.metrics_window, registry)
        self.series = series
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.group = open_group_sync(resources)
        """The group's progress, exporter lease and dense averaging (trainer/distributed.py);
        None with in-process sparse tables (one trainer, always its own exporter)."""
        self.stages = build(
            resources, self.group, self.metrics, Shared(self.retry, self._lock), on_scored
        )
        self.progress = self.stages.progress
        self.checkpointer = Checkpointer(
            settings.data_dir / "trainer" / cfg.group_id, cfg.checkpoints_kept
        )
        self._averaged: torch.nn.Module = (
            self.model
            if self.retrieval is None
            else torch.nn.ModuleList([self.model, self.retrieval.model])
        )
        """What the group averages: the ranker, and the towers beside it."""
        self._paused = threading.Event()
        self._requests: SimpleQueue[tuple[bool, Future[str]]] = SimpleQueue()
        self._thread_id: int | None = None
        self._fetcher: Fetcher | None = None
        self._broken = False
        self._dirty = False
        """Trained or consumed anything since the last checkpoint."""
        self.state = "idle"
        self.last_point: dict[str, Any] = {}
        self.last_error: str | None = None
        self._last_checkpoint = self._last_point_t = time.monotonic()

    @property
    def model(self) -> WideDeep:
        """The ranker (the rank stage's)."""
        return self.stages.rank.model

    @property
    def retrieval(self) -> RetrievalTrainer | None:
        """The two-tower model trained beside the ranker (the towers stage's), if enabled."""
        return None if self.stages.towers is None else self.stages.towers.retrieval

    @property
    def seq(self) -> int:
        """Sequence number of the last checkpoint written or loaded."""
        return self.progress.seq

    @property
    def last_version(self) -> str | None:
        return self.stages.export.last_version

    # --- control (any thread) -------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def export_now(self, activate: bool = True, timeout_s: float = 120.0) -> str:
        """Export from the loop's thread between batches (or here if it is not running)."""
        if self._thread_id is not None and self._thread_id != threading.get_ident():
            future: Future[str] = Future()
            self._requests.put((activate, future))
            return future.result(timeout=timeout_s)
        return self.export(activate)

    # --- the loop -------------------------------------------------------------

    def run(self) -> None:
        """Train until :meth:`request_stop`; finishes the batch, checkpoints, commits."""
        self._thread_id = threading.get_ident()
        self.state = "starting"
        gc_before = gc.get_threshold()
        if self.cfg.gc_threshold:
            gc.set_threshold(self.cfg.gc_threshold, 20, 100)  # see TrainerSettings.gc_threshold
        try:
            self._run()
        finally:
            gc.set_threshold(*gc_before)

    def _run(self) -> None:
        self.restore()
        consumer = self.resources.event_log.consumer(self.cfg.group_id)
        fetcher = Fetcher(consumer, self.cfg.batch_size, self.cfg.max_wait_ms / 1000.0)
        self._fetcher = fetcher
        self.state = "running"
        try:
            while not self._stop.is_set():
                self._serve_requests()
                if self._paused.is_set():
                    self.state = "paused"
                    self._periodic()
                    self._stop.wait(0.05)
                    continue
                self.state = "running"
                dead_before = consumer.dead_lettered
                records = fetcher.get()
                if consumer.dead_lettered != dead_before:
                    self._dirty = True  # the next checkpoint commits past the bad records
                if records:
                    with tracing.batch_span("trainer.batch", records):
                        try:
                            self.train(Batch(records, consumer))
                        except PartitionsBusy:
                            if self._stop.is_set():
                                break  # stopping while a peer trains them: not polled
                            raise
                elif records is IDLE:
                    self.train(Batch.idle(int(time.time() * 1000)))
                self._periodic()
        finally:
            self.state = "stopping"
            try:
                self._serve_requests()
                if not self._broken and self._dirty:
                    self.checkpoint()
            finally:
                self._fail_requests()
                try:
                    self.stages.close()
                    consumer.close()
                finally:
                    self._leave()
                self._fetcher = None
                self._thread_id = None
                self.state = "stopped"
                self._heartbeat()

    def train(self, batch: Batch) -> Batch:
        """``batch`` through the stages (a batch of records, or an idle one)."""
        if batch.records:
            self._dirty = True
        batch = self.stages.run(batch)
        if batch.samples:
            self._dirty = True
        return batch

    def train_records(self, records: list[ConsumedEvent]) -> None:
        """One polled batch through the stages, outside the loop's thread (tests)."""
        self.train(Batch(records, self._fetcher.consumer if self._fetcher else None))

    def close(self) -> None:
        """The stages' threads and connections (:meth:`run` closes them itself: this is
        for a trainer driven batch by batch, :class:`trainer.offline.OnlineReplay`)."""
        try:
            self.stages.close()
        finally:
            self._leave()

    def _leave(self) -> None:
        """Peers stop averaging with this copy; its exporter lease is freed."""
        if self.group is not None:
            self.group.leave()

    def retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying on backend failures with backoff until it works or we stop.

        Stopping while a batch cannot be applied marks the loop broken: no
        checkpoint is written over a half-applied batch, so a restart
        replays from the last good one.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except BackendUnavailable as exc:
                busy = isinstance(exc, PartitionsBusy)  # a peer's batch, not a failure
                if not busy:
                    self.last_error = str(exc)
                if self._stop.is_set():
                    self._broken = self._broken or not busy  # busy: nothing was applied
                    raise
                delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                if busy:
                    log.info("%s; asking again in %.1f s", exc, delay)
                else:
                    log.warning(
                        "backend unavailable (%s); retrying the batch in %.1f s", exc, delay
                    )
                attempt += 1
                self._stop.wait(delay)

    def _periodic(self) -> None:
        now = time.monotonic()
        cfg = self.cfg
        if now - self._last_point_t >= cfg.metrics_every_s:
            self._last_point_t = now
            self._point()
        exporter = self.stages.export
        leads = exporter.leads()  # takes or renews the group's exporter lease (cached)
        if exporter.due(now) and leads:
            try:
                exporter.export("own_family" if cfg.auto_activate else False)
            except Exception as exc:  # a failed export must not stop training; retried later
                self.last_error = f"export failed: {exc!r}"
                exporter.failed(now)
                log.exception("export failed; training goes on")
        if self.group is not None and self.group.due():  # scale-out: dense averaging
            try:
                with self._lock:
                    self.group.average(self._averaged, self.metrics.samples_total)
            except BackendUnavailable as exc:
                log.warning("dense sync skipped: %s", exc)
        if now - self._last_checkpoint >= cfg.checkpoint_every_s and self._dirty:
            try:
                self.checkpoint()
            except OSError as exc:  # nothing committed; the next checkpoint tries again
                self.last_error = f"checkpoint failed: {exc!r}"
                self._last_checkpoint = now
                log.exception("checkpoint failed; offsets stay uncommitted")

    def _point(self) -> None:
        """A metrics point into the series, and the heartbeat."""
        if self._fetcher is not None:
            self.metrics.set_lag(self._fetcher.lag)
        self.last_point = {
            **self.metrics.snapshot(),
            "joiner_pending": len(self.stages.join.joiner),
            "duplicates": self.stages.decode.dedupe.duplicates,
            "checkpoint_seq": self.seq,
        }
        if self.series is not None:
            try:
                self.series.append(self.last_point)
            except BackendUnavailable as exc:
                log.warning("metrics series unavailable: %s", exc)
        self._heartbeat()

    def exports(self) -> bool:
        """Whether this trainer is its group's exporter (see :meth:`Export.leads`)."""
        return self.stages.export.leads()

    def _serve_requests(self) -> None:
        while True:
            try:
                activate, future = self._requests.get_nowait()
            except Empty:
                return
            try:
                future.set_result(self.export(activate))
            except Exception as exc:  # the caller gets the error, the loop goes on
                future.set_exception(exc)

    def _fail_requests(self) -> None:
        while True:
            try:
                _, future = self._requests.get_nowait()
            except Empty:
                return
            future.set_exception(RuntimeError("trainer stopped before exporting"))

    # --- export, checkpoint, restore ---------------------------------------

    def export(self, activate: bool | Literal["own_family"]) -> str:
        """Publish the current dense network as a registry version."""
        return self.stages.export.export(activate)

    def checkpoint(self) -> None:
        """Write a checkpoint of every stage's state, then commit its offsets."""
        self.retry(self.stages.rank.ranker.settle)  # no push of a covered batch in flight
        seq = self.seq + 1
        positions = dict(self.progress.positions)

        def write(directory: Any) -> None:
            checkpoint = Checkpoint(seq, directory, {
                "seq": seq,
                "created_at_ms": int(time.time() * 1000),
                "schema_hash": self.schema.schema_hash(),
            })
            self.stages.save(checkpoint)
            (directory / STATE_FILE).write_text(json.dumps(checkpoint.state))

        with self._lock:
            self.checkpointer.save(seq, write)
        self.progress.seq = seq
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self.stages.record.saved()
        fetcher = self._fetcher
        if fetcher is not None:
            try:
                _commit(fetcher.consumer, positions)
            except (BackendUnavailable, Conflict) as exc:
                # The checkpoint stands: a restart replays from the last commit and the
                # restored dedupe window (or, in a group, its progress) skips what it covers;
                # a partition moved away is resumed by its new owner the same way.
                log.warning("commit failed after checkpoint %d: %s", seq, exc)

    def restore(self) -> None:
        """Load the newest checkpoint into every stage (each stage also starts from
        nothing when there is none: the record stage reads the journal either way)."""
        seq = self.checkpointer.latest_seq()
        checkpoint = None
        if seq is not None:
            directory = self.checkpointer.path(seq)
            state = json.loads((directory / STATE_FILE).read_text())
            same_schema = state.get("schema_hash") in (None, self.schema.schema_hash())
            if not same_schema:
                # The network's inputs, the towers' columns and the pending impressions'
                # packed values mean something else. Sparse rows (keyed by value),
                # histories, counters and positions still hold, and are kept.
                log.warning(
                    "checkpoint %d was written for schema %s, this trainer's is %s: the "
                    "dense network, the towers and the pending impressions start afresh",
                    seq, state.get("schema_hash"), self.schema.schema_hash(),
                )
            checkpoint = Checkpoint(seq, directory, state, same_schema)
        self.stages.restore(checkpoint)
        if seq is not None:
            self.progress.seq = seq
            log.info("restored checkpoint %d (%d events trained)", seq, self.metrics.events_total)

    def _heartbeat(self) -> None:
        if self.series is None:
            return
        try:
            self.series.heartbeat(self.status(), self.cfg.heartbeat_ttl_s)
        except BackendUnavailable as exc:
            log.warning("heartbeat failed: %s", exc)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "group_id": self.cfg.group_id,
            "events_total": self.metrics.events_total,
            "samples_total": self.metrics.samples_total,
            "batches_total": self.metrics.batches_total,
            "duplicates": self.stages.decode.dedupe.duplicates,
            "checkpoint_seq": self.seq,
            "last_version": self.last_version,
            "positions": {str(p): o for p, o in sorted(self.progress.positions.items())},
            "last_error": self.last_error,
            "metrics": self.last_point,
            "exporter": self.group is None or self.group.exporter,
            "group": None if self.group is None else self.group.status(),
            "served": self.stages.join.status(),
            "retrieval": None if self.retrieval is None else self.retrieval.status(),
            "sequence": None if self.stages.sequence is None else self.stages.sequence.status(),
        }


def _commit(consumer: EventConsumer, positions: dict[int, int]) -> None:
    """Commit ``positions`` of the partitions still owned; the consumer moves each past the
    bad records it dead-lettered there (with none trained since, too)."""
    owned = set(consumer.assignment())  # a rebalance may have moved some partitions away
    commit = [Position(p, o) for p, o in sorted(positions.items()) if p in owned]
    if commit or consumer.dead_lettered:
        consumer.commit(commit)
