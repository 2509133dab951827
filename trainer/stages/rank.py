"""Rank: the ranker's training step, and the batch recorded into the trainer's stores.

Owns the Wide&Deep network and its optimizer (``dense.pt`` in a
checkpoint), and, when they live in this process, the sparse tables
(``sparse/<table>/``) and the training activity store (``activity/``):
durable tables and shared stores keep their own state. Pushes to Redis run
beside the activity record (:meth:`~trainer.step.Trainer.advance`) and
have landed (:meth:`~trainer.step.Trainer.settle`) when the stage returns.

In a group, the first write of a batch (its push, its activity) waits on the
``fence`` the decode stage gives (:meth:`~trainer.stages.decode.Decode.fence`):
a batch whose partitions' claims another member took meanwhile is dropped
here, before it writes anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from feature_store.runtime.resources import Resources
from trainer.checkpoint import DENSE_FILE
from trainer.labels import Sample
from trainer.metrics import TrainerMetrics
from trainer.model import WideDeep, upgrade_state_dict
from trainer.samples import labelled_rows
from trainer.stages.base import Batch, Checkpoint, Shared
from trainer.step import Trainer

log = logging.getLogger(__name__)

OnScored = Callable[[list[Sample], np.ndarray], None]
"""Called with each step's samples that have an engagement label and their
pre-update scores (the evaluation's prequential figures)."""


class Rank:
    """Trains :attr:`Batch.samples`; fills :attr:`Batch.unique_keys`."""

    def __init__(
        self,
        resources: Resources,
        model: WideDeep,
        ranker: Trainer,
        metrics: TrainerMetrics,
        shared: Shared,
        on_scored: OnScored | None = None,
        fence: Callable[[Batch], bool] | None = None,
    ) -> None:
        self.resources = resources
        self.fence = fence
        """Called before a batch's first write; False: the batch was dropped (emptied)."""
        self.model = model
        self.ranker = ranker
        self.metrics = metrics
        self.shared = shared
        self.on_scored = on_scored
        settings = resources.settings
        self.durable_sparse = settings.sparse.backend != "memory"
        self.in_process_stores = settings.stores.backend == "memory"

    def process(self, batch: Batch) -> Batch:
        retry = self.shared.retry
        writes = batch.samples or batch.events
        if writes and self.fence is not None and not self.fence(batch):
            return batch
        if batch.samples:
            batch.unique_keys = self._train(batch.samples)
        self.ranker.advance()  # Redis applies the pushes while the activity is recorded
        events, lookup = batch.events, batch.lookup
        if events and lookup is not None:
            retry(lambda: self.resources.training_activity.record(events, lookup.videos))
        retry(self.ranker.settle)  # the pushes land before the record stage's journal line
        return batch

    def _train(self, samples: list[Sample]) -> int:
        """One training step over ``samples``; returns the batch's unique key count."""
        rows = labelled_rows(samples, self.ranker.extractor.layout)
        batch = rows.values.to_batch()

        def attempt() -> int:
            with self.shared.lock:
                result = self.ranker.step(batch, rows.targets, rows.weights)
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

        return self.shared.retry(attempt)

    def save(self, checkpoint: Checkpoint) -> None:
        dense = {"model": self.model.state_dict(), "optimizer": self.ranker.optimizer.state_dict()}
        torch.save(dense, checkpoint.directory / DENSE_FILE)
        if not self.durable_sparse:
            for name, table in self.resources.tables.items():
                table.snapshot(checkpoint.directory / "sparse" / name)
        if self.in_process_stores:
            self.resources.training_activity.snapshot(checkpoint.directory / "activity")

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            return
        if checkpoint.same_schema:
            self._restore_network(checkpoint)
        self._restore_stores(checkpoint)

    def _restore_network(self, checkpoint: Checkpoint) -> None:
        """The dense network and its optimizer (written for this schema)."""
        dense = torch.load(checkpoint.directory / DENSE_FILE, weights_only=True)
        if upgrade_state_dict(self.model, dense["model"]):
            # A checkpoint from before some heads (before any: its one output is the
            # primary head's row): its rows keep their heads, the new heads start
            # fresh, and so does Adam (its moments have the old layer's shape).
            self.model.load_state_dict(dense["model"])
            log.warning(
                "checkpoint %d has fewer heads: heads added, optimizer reset", checkpoint.seq
            )
        else:
            self.model.load_state_dict(dense["model"])
            self.ranker.optimizer.load_state_dict(dense["optimizer"])

    def _restore_stores(self, checkpoint: Checkpoint) -> None:
        """The in-process sparse tables and activity a checkpoint holds (durable tables
        and shared stores keep their own state)."""
        directory = checkpoint.directory
        if not self.durable_sparse:
            for name, table in self.resources.tables.items():
                if (directory / "sparse" / name).is_dir():
                    table.restore(directory / "sparse" / name)
        if self.in_process_stores and (directory / "activity").is_dir():
            self.resources.training_activity.restore(directory / "activity")

    def close(self) -> None:
        self.ranker.close()
