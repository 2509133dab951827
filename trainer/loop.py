"""The online training loop: consume, dedupe, label, train, record, checkpoint, commit.

One iteration::

    poll up to batch_size events (waiting at most max_wait_ms)
    drop event ids already trained (dedupe window)
    join impressions, label events (trainer.labels); feature values of the
      moments shown, from the stores' pre-batch state (trainer.samples)
    pull -> forward (prequential scores) -> backward -> push -> dense step
    record the events into its own activity store (histories, counters)
    every checkpoint_every_s: checkpoint, then commit the offsets it covers

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
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from feature_store.errors import BackendUnavailable, Conflict
from feature_store.event_types import of_types
from feature_store.eventlog.base import ConsumedEvent, EventConsumer, Position
from feature_store.events import Event
from feature_store.features.values import FeatureValues
from feature_store.heads import HEADS
from feature_store.models.retrieval_io import ARTIFACTS, MANIFEST_KEY, Towers
from feature_store.ops.timeseries import MetricsSeries
from feature_store.runtime import tracing
from feature_store.runtime.resources import Resources
from trainer.checkpoint import DEDUPE_FILE, DENSE_FILE, SHOWN_FILE, STATE_FILE, Checkpointer
from trainer.dedupe import DedupeWindow, id_hash
from trainer.distributed import open_group_sync
from trainer.export import publish
from trainer.fetch import IDLE, Fetcher
from trainer.labels import Joiner, LabelPolicy, Moments, Sample
from trainer.metrics import TrainerMetrics
from trainer.model import WideDeep, upgrade_state_dict
from trainer.retrieval import RetrievalTrainer
from trainer.retrieval_export import writer as retrieval_writer
from trainer.samples import Lookup, featurise, labelled_rows
from trainer.served import ServedJoin
from trainer.step import Trainer

log = logging.getLogger(__name__)

T = TypeVar("T")

JOURNAL_FILE = "journal.jsonl"
SHOWN = of_types("shows")
"""Impressions: the moments the current model scores as shown."""
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class OnlineTrainer:
    """The loop and its state; :class:`trainer.component.TrainerComponent` drives it."""

    def __init__(
        self,
        resources: Resources,
        *,
        registry: CollectorRegistry | None = None,
        series: MetricsSeries | None = None,
        on_scored: Callable[[list[Sample], np.ndarray], None] | None = None,
    ) -> None:
        settings = resources.settings
        self.on_scored = on_scored
        """Called with each trained step's samples that have an engagement label and their
        pre-update scores (evaluation)."""
        cfg = settings.trainer
        self.resources = resources
        self.cfg = cfg
        self.schema = resources.schema
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.model = WideDeep(self.schema, cfg.hidden)
        self.durable_sparse = settings.sparse.backend != "memory"
        self.group = open_group_sync(resources)
        """The group's progress, exporter lease and dense averaging (trainer/distributed.py);
        None with in-process sparse tables (one trainer, always its own exporter)."""
        self.trainer = Trainer(
            self.schema,
            resources.tables,
            self.model,
            cfg.dense_learning_rate,
            head_weights=[cfg.head_loss_weights.get(h.name, h.loss_weight) for h in HEADS],
        )
        self.retrieval = (
            RetrievalTrainer(
                Towers.from_settings(self.schema, settings.retrieval),
                self.trainer.extractor.layout,
                resources.tables,
                settings.retrieval,
            )
            if settings.retrieval.enabled
            else None
        )
        """The two-tower model trained beside the ranker (:mod:`trainer.retrieval`)."""
        policy = LabelPolicy(cfg, settings.features)
        self.joiner = Joiner(policy, cfg.join_window_ms, cfg.joiner_max_entries)
        self.dedupe = DedupeWindow(cfg.dedupe_window)
        self.metrics = TrainerMetrics(cfg.metrics_window, registry)
        self.series = series
        self.root: Path = settings.data_dir / "trainer" / cfg.group_id
        self.checkpointer = Checkpointer(self.root, cfg.checkpoints_kept)
        self.in_process_stores = settings.stores.backend == "memory"
        self.positions: dict[int, int] = {}
        """Next offset per partition after the last trained batch."""
        self.log_times: dict[int, int] = {}
        """Log time (ms) of the newest record trained per partition: where a restarted
        trainer resumes reading the served log (minus its join window)."""
        self.served = (
            ServedJoin(
                resources.served_log, settings.served_log, self.trainer.extractor,
                settings.sparse.model_name, self.metrics.c_served_join,
            )
            if resources.served_log is not None
            else None
        )
        """The served log's index (:mod:`trainer.served`), when there is a served log."""
        self._served_aligned: bool | None = None
        """Whether the served topic has the events topic's partition count (then this
        trainer reads only the served partitions of its own users)."""
        self._averaged: torch.nn.Module = (
            self.model
            if self.retrieval is None
            else torch.nn.ModuleList([self.model, self.retrieval.model])
        )
        """What the group averages: the ranker, and the towers beside it."""
        self.seq = 0
        """Sequence number of the last checkpoint written or loaded."""
        self._trained_ids: list[str] = []
        """Event ids trained since the last checkpoint (kept only when audited)."""
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._requests: SimpleQueue[tuple[bool, Future[str]]] = SimpleQueue()
        self._thread_id: int | None = None
        self._fetcher: Fetcher | None = None
        self._broken = False
        self._dirty = False
        """Trained or consumed anything since the last checkpoint."""
        self.state = "idle"
        self.last_version: str | None = None
        self.last_point: dict[str, Any] = {}
        self.last_error: str | None = None
        self._batches_since_export = 0
        self._last_export = self._last_checkpoint = self._last_point_t = time.monotonic()
        self._lock = threading.Lock()

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
                    self._periodic(idle=True)
                    self._stop.wait(0.05)
                    continue
                self.state = "running"
                dead_before = consumer.dead_lettered
                records = fetcher.get()
                if consumer.dead_lettered != dead_before:
                    self._dirty = True  # the next checkpoint commits past the bad records
                if records:
                    with tracing.batch_span("trainer.batch", records):
                        self.train_records(records)
                elif records is IDLE:
                    self._train_idle()
                    self._retry(self.trainer.settle)
                self._periodic(idle=not records)
        finally:
            self.state = "stopping"
            try:
                self._serve_requests()
                if not self._broken and self._dirty:
                    self.checkpoint()
            finally:
                self._fail_requests()
                self.trainer.close()
                if self.served is not None:
                    self.served.close()
                consumer.close()
                if self.group is not None:  # peers stop averaging with this copy; lease freed
                    self.group.leave()
                self._fetcher = None
                self._thread_id = None
                self.state = "stopped"
                self._heartbeat()

    def train_records(self, records: list[ConsumedEvent]) -> None:
        """Dedupe, label, train and record one polled batch; advances positions."""
        started = time.perf_counter()
        self._dirty = True
        fresh = self.dedupe.admit([r.event.event_id for r in records])
        group = self.group
        if group is not None:  # scale-out: drop what another member already trained
            fresh = self._retry(lambda: group.unclaimed(records, fresh))
        events = [records[i].event for i in fresh]
        partitions = [records[i].partition for i in fresh]
        log_times = [records[i].log_ts for i in fresh]
        lookup = self._retry(lambda: Lookup(self.resources.catalog, events))
        if self.served is not None and records:
            if self._fetcher is not None:
                consumer = self._fetcher.consumer  # the broker may still be starting: retried
                self._retry(lambda: self._follow_served(consumer, records))

        def moments(positions: list[int]) -> Moments:
            return self.moments(
                [events[i] for i in positions],
                lookup,
                [partitions[i] for i in positions],
                [log_times[i] for i in positions],
            )

        # observe calls moments before it changes any state: a retry is clean.
        samples = self._retry(
            lambda: self.joiner.observe(events, partitions, lookup.durations, moments)
        )
        keys = self._train_samples(samples)
        self.trainer.advance()  # Redis applies the pushes while the activity is recorded
        if events:
            self._retry(lambda: self.resources.training_activity.record(events, lookup.videos))
        self._retry(self.trainer.settle)  # the pushes land before the journal line
        self._record_trained(records, [e.event_id for e in events])
        # The towers train on buffered positives after the batch is recorded as trained:
        # a crash in between loses a step of the towers, never trains an event twice.
        self._train_retrieval()
        self._batches_since_export += 1
        self.metrics.observe_batch(
            len(records),
            len(samples),
            len(records) - len(fresh),
            keys,
            time.perf_counter() - started,
        )

    def _record_trained(self, records: list[ConsumedEvent], ids: list[str]) -> None:
        """A trained batch's positions, journal line (``ids``: its fresh events), group
        progress, served-log progress and audit trail."""
        for r in records:
            if r.offset + 1 > self.positions.get(r.partition, 0):
                self.positions[r.partition] = r.offset + 1
            if r.log_ts > self.log_times.get(r.partition, 0):
                self.log_times[r.partition] = r.log_ts
        if self.durable_sparse and ids:
            with open(self.root / JOURNAL_FILE, "a") as fh:
                fh.write(json.dumps(ids) + "\n")
        group = self.group
        if group is not None:  # the group's progress, right after the journal line
            self._retry(lambda: group.trained(records))
        if self.served is not None and records:
            self.served.trained_to(max(r.log_ts for r in records))
        if self.cfg.audit:
            self._trained_ids += ids

    def _train_retrieval(self) -> None:
        """The towers' steps over the buffered positives (after the ranker's pushes
        settled: the tower tables are pulled and pushed synchronously, never beside them)."""
        if self.retrieval is None:
            return
        with self._lock:
            while self.retrieval.step():
                pass

    def _train_idle(self) -> None:
        """Train the impressions that timed out by wall clock while the stream was idle."""
        started = time.perf_counter()
        samples = self.joiner.flush_idle(int(time.time() * 1000))
        if samples:
            keys = self._train_samples(samples)
            self.metrics.observe_batch(0, len(samples), 0, keys, time.perf_counter() - started)

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
        layout = self.trainer.extractor.layout
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
                self.trainer.extractor,
                [events[i] for i in rest],
                lookup,
                self.resources.training_activity,
            )
        unscored = [i for i in shown if np.isnan(scores[i])]  # not served, or by another family
        if unscored:
            batch = FeatureValues(layout, values[unscored]).to_batch()
            with self._lock:
                scores[unscored] = self.trainer.score(batch)
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
        resume = min(
            (self.log_times[p] for p in assignment if p in self.log_times),
            default=min(r.log_ts for r in records),
        )
        aligned = self._served_aligned
        served.follow(assignment if aligned else None, resume, aligned=aligned)

    def _train_samples(self, samples: list[Sample]) -> int:
        """One training step over ``samples``; returns the batch's unique key count."""
        if not samples:
            return 0
        self._dirty = True
        rows = labelled_rows(samples, self.trainer.extractor.layout)
        batch = rows.values.to_batch()
        if self.retrieval is not None:
            self.retrieval.add(samples)

        def attempt() -> int:
            with self._lock:
                result = self.trainer.step(batch, rows.targets, rows.weights)
            # Scored as shown where known (see Sample.score), else by this step's forward.
            scores = np.where(np.isnan(rows.shown_scores), result.scores, rows.shown_scores)
            self.metrics.observe_scores(
                rows.video_ids,
                scores,
                rows.labels.astype(np.float64),
                rows.weights.astype(np.float64),
                result.heads,
                rows.targets.astype(np.float64),
            )
            if self.on_scored is not None:
                engaged = ~np.isnan(rows.labels)
                if engaged.all():
                    self.on_scored(samples, scores)
                else:
                    kept = np.flatnonzero(engaged)
                    self.on_scored([samples[i] for i in kept], scores[kept])
            return result.unique_keys

        return self._retry(attempt)

    def _retry(self, fn: Callable[[], T]) -> T:
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
                self.last_error = str(exc)
                if self._stop.is_set():
                    self._broken = True
                    raise
                delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                log.warning("backend unavailable (%s); retrying the batch in %.1f s", exc, delay)
                attempt += 1
                self._stop.wait(delay)

    def _periodic(self, idle: bool) -> None:
        now = time.monotonic()
        cfg = self.cfg
        if now - self._last_point_t >= cfg.metrics_every_s:
            self._last_point_t = now
            if self._fetcher is not None:
                self.metrics.set_lag(self._fetcher.lag)
            self.last_point = {
                **self.metrics.snapshot(),
                "joiner_pending": len(self.joiner),
                "duplicates": self.dedupe.duplicates,
                "checkpoint_seq": self.seq,
            }
            if self.series is not None:
                try:
                    self.series.append(self.last_point)
                except BackendUnavailable as exc:
                    log.warning("metrics series unavailable: %s", exc)
            self._heartbeat()
        leads = self.exports()  # takes or renews the group's exporter lease (cached)
        fresh = self._batches_since_export > 0  # nothing new since the last export: skip
        due_by_time = (
            cfg.export_every_s > 0 and now - self._last_export >= cfg.export_every_s and fresh
        )
        due_by_count = (
            cfg.export_every_batches > 0 and self._batches_since_export >= cfg.export_every_batches
        )
        if (due_by_time or due_by_count) and self.metrics.samples_total > 0 and leads:
            try:
                self.export("own_family" if cfg.auto_activate else False)
            except Exception as exc:  # a failed export must not stop training; retried later
                self.last_error = f"export failed: {exc!r}"
                self._last_export = now
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

    def exports(self) -> bool:
        """Whether this trainer is its group's exporter (alone, it always is): only it
        exports on its timer and answers *Export now* (``trainer/distributed.py``)."""
        group = self.group
        if group is None:
            return True
        try:
            return group.leads()
        except BackendUnavailable as exc:  # no Redis, no lease: nobody exports meanwhile
            log.warning("exporter lease unavailable: %s", exc)
            return False

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
        artifacts = None
        extra: dict[str, Any] = {"head_samples": dict(self.metrics.head_samples)}
        if self.retrieval is not None:
            artifacts = (
                list(ARTIFACTS),
                retrieval_writer(self.retrieval, self.resources.catalog.iter_all()),
            )
            extra[MANIFEST_KEY] = self.retrieval.towers.describe()
        with self._lock:
            version = publish(
                self.resources.registry,
                self.model,
                self.schema,
                family=self.resources.settings.sparse.model_name,
                training_position={
                    "group_id": self.cfg.group_id,
                    "exporter": None if self.group is None else self.group.member,
                    "positions": {str(p): o for p, o in sorted(self.positions.items())},
                    "events_total": self.metrics.events_total,
                    "samples_total": self.metrics.samples_total,
                    "checkpoint_seq": self.seq,
                },
                metrics=self.metrics.window(),
                activate=activate,
                keep=self.cfg.registry_keep,
                extra=extra,
                artifacts=artifacts,
            )
        self.last_version = version
        self._last_export = time.monotonic()
        self._batches_since_export = 0
        log.info("exported %s (activate=%s)", version, activate)
        return version

    def checkpoint(self) -> None:
        """Write a checkpoint of the whole trained state, then commit its offsets."""
        self._retry(self.trainer.settle)  # no push of a covered batch still in flight
        seq = self.seq + 1
        positions = dict(self.positions)
        if self.cfg.audit:
            self._write_audit(seq)

        def write(directory: Path) -> None:
            dense = {
                "model": self.model.state_dict(),
                "optimizer": self.trainer.optimizer.state_dict(),
            }
            torch.save(dense, directory / DENSE_FILE)
            np.save(directory / DEDUPE_FILE, self.dedupe.to_array())
            joiner, shown = self.joiner.state()
            np.save(directory / SHOWN_FILE, shown)
            if self.retrieval is not None:
                self.retrieval.save(directory)
            if not self.durable_sparse:
                for name, table in self.resources.tables.items():
                    table.snapshot(directory / "sparse" / name)
            if self.in_process_stores:
                self.resources.training_activity.snapshot(directory / "activity")
            state = {
                "seq": seq,
                "created_at_ms": int(time.time() * 1000),
                "schema_hash": self.schema.schema_hash(),
                "positions": {str(p): o for p, o in positions.items()},
                "log_times": {str(p): t for p, t in self.log_times.items()},
                "events_total": self.metrics.events_total,
                "samples_total": self.metrics.samples_total,
                "batches_total": self.metrics.batches_total,
                "head_samples": self.metrics.head_samples,
                "joiner": joiner,
                "watch_quantiles": self.joiner.policy.watch.state(),
                "served_join": None if self.served is None else dict(self.served.counts),
                "last_version": self.last_version,
            }
            (directory / STATE_FILE).write_text(json.dumps(state))

        with self._lock:
            self.checkpointer.save(seq, write)
        self.seq = seq
        self._dirty = False
        self._trained_ids = []
        self._last_checkpoint = time.monotonic()
        (self.root / JOURNAL_FILE).unlink(missing_ok=True)
        fetcher = self._fetcher
        if fetcher is not None:
            try:
                _commit(fetcher.consumer, positions)
            except (BackendUnavailable, Conflict) as exc:
                # The checkpoint stands: a restart replays from the last commit and the
                # restored dedupe window (or, in a group, its progress) skips what it covers;
                # a partition moved away is resumed by its new owner the same way.
                log.warning("commit failed after checkpoint %d: %s", seq, exc)

    def _write_audit(self, seq: int) -> None:
        audit = self.root / "audit"
        audit.mkdir(exist_ok=True)
        path = audit / f"{seq:010d}.ids"
        with open(path, "w") as fh:
            fh.write("".join(i + "\n" for i in self._trained_ids))
            fh.flush()
            os.fsync(fh.fileno())

    def restore(self) -> None:
        """Load the newest checkpoint (and, for durable sparse tables, the journal)."""
        seq = self.checkpointer.latest_seq()
        audit = self.root / "audit"
        if audit.is_dir():  # segments of checkpoints that never became LATEST
            for path in audit.glob("*.ids"):
                if seq is None or int(path.stem) > seq:
                    path.unlink()
        if seq is not None:
            self._restore_checkpoint(seq)
        self._replay_journal()

    def _restore_checkpoint(self, seq: int) -> None:
        directory = self.checkpointer.path(seq)
        state = json.loads((directory / STATE_FILE).read_text())
        same_schema = state.get("schema_hash") in (None, self.schema.schema_hash())
        self._restore_network(seq, directory, state, same_schema)
        self.dedupe.load_array(np.load(directory / DEDUPE_FILE))
        if self.retrieval is not None and same_schema:
            self.retrieval.restore(directory)
        self._restore_stores(directory)
        self.positions = {int(p): int(o) for p, o in state["positions"].items()}
        self.log_times = {int(p): int(t) for p, t in state.get("log_times", {}).items()}
        self._restore_joiner(directory, state, same_schema)
        self.metrics.restore_totals(state)
        if self.served is not None and state.get("served_join"):
            self.served.load_counts(state["served_join"])
        self.last_version = state.get("last_version")
        self.seq = seq
        log.info("restored checkpoint %d (%d events trained)", seq, self.metrics.events_total)

    def _restore_stores(self, directory: Path) -> None:
        """The in-process sparse tables and activity a checkpoint holds (durable tables
        and shared stores keep their own state)."""
        if not self.durable_sparse:
            for name, table in self.resources.tables.items():
                if (directory / "sparse" / name).is_dir():
                    table.restore(directory / "sparse" / name)
        if self.in_process_stores and (directory / "activity").is_dir():
            self.resources.training_activity.restore(directory / "activity")

    def _restore_joiner(self, directory: Path, state: dict[str, Any], same_schema: bool) -> None:
        """The pending impressions (dropped when written for another schema: their packed
        values mean something else) and the watch head's quantiles."""
        shown_file = directory / SHOWN_FILE
        shown = np.load(shown_file) if shown_file.is_file() else np.zeros((0, 0), np.uint64)
        if not same_schema:
            shown = np.zeros((0, 0), np.uint64)
        self.joiner.load_state(state.get("joiner", {}) if len(shown) else {}, shown)
        if "watch_quantiles" in state:
            self.joiner.policy.watch.load_state(state["watch_quantiles"])

    def _restore_network(
        self, seq: int, directory: Path, state: dict[str, Any], same_schema: bool
    ) -> None:
        """The dense network and its optimizer from checkpoint ``seq``, unless it was
        written for another schema (an upgrade that changed the columns)."""
        if not same_schema:
            # The network's inputs, the towers' columns and the pending impressions'
            # packed values mean something else. Sparse rows (keyed by value),
            # histories, counters and positions still hold, and are kept.
            log.warning(
                "checkpoint %d was written for schema %s, this trainer's is %s: the "
                "dense network, the towers and the pending impressions start afresh",
                seq, state.get("schema_hash"), self.schema.schema_hash(),
            )
            return
        dense = torch.load(directory / DENSE_FILE, weights_only=True)
        if upgrade_state_dict(self.model, dense["model"]):
            # A checkpoint from before some heads (before any: its one output is the
            # primary head's row): its rows keep their heads, the new heads start
            # fresh, and so does Adam (its moments have the old layer's shape).
            self.model.load_state_dict(dense["model"])
            log.warning("checkpoint %d has fewer heads: heads added, optimizer reset", seq)
        else:
            self.model.load_state_dict(dense["model"])
            self.trainer.optimizer.load_state_dict(dense["optimizer"])

    def _replay_journal(self) -> None:
        journal = self.root / JOURNAL_FILE
        if not journal.is_file():
            return
        if self.durable_sparse:
            ids: list[str] = []
            with open(journal) as fh:
                for line in fh:
                    try:
                        ids += json.loads(line)
                    except json.JSONDecodeError:
                        break  # torn last line: that batch's record was not finished
            self.dedupe.remember(id_hash(i) for i in ids)
            if self.cfg.audit:
                self._trained_ids += ids
            log.info("journal: %d event ids pushed after the checkpoint", len(ids))
            return  # kept until the next checkpoint holds these ids in its window
        journal.unlink()  # in-process tables: the checkpoint rolled those batches back

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
            "duplicates": self.dedupe.duplicates,
            "checkpoint_seq": self.seq,
            "last_version": self.last_version,
            "positions": {str(p): o for p, o in sorted(self.positions.items())},
            "last_error": self.last_error,
            "metrics": self.last_point,
            "exporter": self.group is None or self.group.exporter,
            "group": None if self.group is None else self.group.status(),
            "served": None if self.served is None else self.served.status(),
            "retrieval": None if self.retrieval is None else self.retrieval.status(),
        }


def _commit(consumer: EventConsumer, positions: dict[int, int]) -> None:
    """Commit ``positions`` of the partitions still owned; the consumer moves each past the
    bad records it dead-lettered there (with none trained since, too)."""
    owned = set(consumer.assignment())  # a rebalance may have moved some partitions away
    commit = [Position(p, o) for p, o in sorted(positions.items()) if p in owned]
    if commit or consumer.dead_lettered:
        consumer.commit(commit)
