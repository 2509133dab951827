"""The stages of one trainer, built once, run in order, checkpointed and closed together.

Order matters, and is the argument of ``docs/training.md``: decode (never
train an event twice), join (labels and the values of each sample's moment,
from the stores' *pre-batch* state), rank (step; then the batch's events are
recorded into the stores), record (positions and the journal line, once the
pushes landed), towers (after the batch counts as trained: a crash in
between loses a towers' step, never trains an event twice), export (counts
what is new since the last version).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from feature_store.heads import HEADS
from feature_store.models.retrieval_io import Towers as TowerColumns
from feature_store.runtime.resources import Resources
from trainer.dedupe import DedupeWindow
from trainer.distributed import GroupSync, exports
from trainer.labels import Joiner, LabelPolicy
from trainer.metrics import TrainerMetrics
from trainer.model import WideDeep
from trainer.retrieval import RetrievalTrainer
from trainer.sequence_share import SharedViews
from trainer.served import ServedJoin
from trainer.stages.base import Batch, Checkpoint, Progress, Shared, Stage
from trainer.stages.decode import Decode
from trainer.stages.export import Export
from trainer.stages.join import Join
from trainer.stages.rank import OnScored, Rank
from trainer.stages.record import Record
from trainer.stages.sequence import SequenceStage, sequence_stage
from trainer.stages.towers import Towers
from trainer.step import Trainer

log = logging.getLogger(__name__)


@dataclass
class Pipeline:
    """The stages in order, and the named ones the loop asks things of."""

    decode: Decode
    join: Join
    rank: Rank
    record: Record
    towers: Towers | None
    """None when ``retrieval.enabled`` is off."""
    sequence: SequenceStage | None
    """None when ``sequence.enabled`` is off."""
    export: Export
    metrics: TrainerMetrics
    progress: Progress

    @property
    def stages(self) -> Sequence[Stage]:
        towers = [] if self.towers is None else [self.towers]
        sequence = [] if self.sequence is None else [self.sequence]
        return [self.decode, self.join, self.rank, self.record, *towers, *sequence, self.export]

    def run(self, batch: Batch) -> Batch:
        """``batch`` through every stage; its figures into the metrics."""
        for stage in self.stages:
            batch = stage.process(batch)
        if batch.records or batch.samples:
            self.metrics.observe_batch(
                len(batch.records),
                len(batch.samples),
                batch.duplicates,
                batch.unique_keys,
                time.perf_counter() - batch.started,
            )
        return batch

    def save(self, checkpoint: Checkpoint) -> None:
        for stage in self.stages:
            stage.save(checkpoint)

    def restore(self, checkpoint: Checkpoint | None) -> None:
        for stage in self.stages:
            stage.restore(checkpoint)

    def close(self) -> None:
        """Every stage's :meth:`~Stage.close`, the last one first; all run even if one
        raises (the first error is raised after)."""
        with ExitStack() as stack:
            for stage in self.stages:
                stack.callback(stage.close)


def build(
    resources: Resources,
    group: GroupSync | None,
    metrics: TrainerMetrics,
    shared: Shared,
    on_scored: OnScored | None = None,
) -> Pipeline:
    """The stages of the trainer ``resources.settings`` describe (seeded by its
    ``trainer.seed``: the dense networks are initialised here)."""
    settings = resources.settings
    cfg = settings.trainer
    schema = resources.schema
    torch.manual_seed(cfg.seed)
    model = WideDeep(schema, cfg.hidden)
    ranker = Trainer(
        schema,
        resources.tables,
        model,
        cfg.dense_learning_rate,
        head_weights=[cfg.head_loss_weights.get(h.name, h.loss_weight) for h in HEADS],
    )
    retrieval = (
        RetrievalTrainer(
            TowerColumns.from_settings(schema, settings.retrieval),
            ranker.extractor.layout,
            resources.tables,
            settings.retrieval,
        )
        if settings.retrieval.enabled
        else None
    )
    sequence = (
        sequence_stage(
            settings.sequence, cfg.seed,
            # Several trainers: one tower, the exporter's, of every member's views.
            SharedViews(resources.redis_client, cfg.group_id, settings.sequence.max_views)
            if group is not None and cfg.group_sync else None,
            lambda: exports(group),
            (settings.factorization, resources.factors)
            if settings.factorization.enabled else None,
        )
        if settings.sequence.enabled else None
    )
    served = (
        ServedJoin(
            resources.served_log, settings.served_log, ranker.extractor,
            settings.sparse.model_name, metrics.c_served_join,
        )
        if resources.served_log is not None
        else None
    )
    progress = Progress()
    dedupe = DedupeWindow(cfg.dedupe_window)
    joiner = Joiner(LabelPolicy(cfg, settings.features), cfg.join_window_ms, cfg.joiner_max_entries)
    join = Join(resources, joiner, ranker, served, progress, shared)
    decode = Decode(dedupe, group, shared)
    return Pipeline(
        decode=decode,
        join=join,
        rank=Rank(
            resources, model, ranker, metrics, shared, on_scored,
            fence=None if group is None else decode.fence,
        ),
        record=Record(
            settings.data_dir / "trainer" / cfg.group_id, progress, dedupe, join, group,
            metrics, shared, durable_sparse=settings.sparse.backend != "memory",
            audit=cfg.audit,
        ),
        towers=None if retrieval is None else Towers(retrieval, shared),
        sequence=sequence,
        export=Export(resources, model, retrieval, sequence, progress, group, metrics, shared),
        metrics=metrics,
        progress=progress,
    )
