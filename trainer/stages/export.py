"""Export: publish the ranker (and the towers) as registry versions (:mod:`trainer.export`).

Counts the batches trained since the last export (an export with nothing
new is skipped), says when one is due (``trainer.export_every_s`` /
``export_every_batches``) and whether this trainer may export (alone it
always may; in a group, only the holder of the exporter lease,
:mod:`trainer.distributed`). Owns ``last_version`` in a checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from feature_store.models import sequence_io
from feature_store.models.retrieval_io import ARTIFACTS, MANIFEST_KEY
from feature_store.runtime.resources import Resources
from trainer.distributed import GroupSync, exports
from trainer.export import all_writers, publish
from trainer.metrics import TrainerMetrics
from trainer.model import WideDeep
from trainer.retrieval import RetrievalTrainer
from trainer.retrieval_export import VideoInputs
from trainer.retrieval_export import writer as retrieval_writer
from trainer.sequence_export import writer as sequence_writer
from trainer.stages.base import Batch, Checkpoint, Progress, Shared
from trainer.stages.sequence import SequenceStage

log = logging.getLogger(__name__)


class Export:
    """Publishes versions; see the module doc."""

    def __init__(
        self,
        resources: Resources,
        model: WideDeep,
        retrieval: RetrievalTrainer | None,
        sequence: SequenceStage | None,
        progress: Progress,
        group: GroupSync | None,
        metrics: TrainerMetrics,
        shared: Shared,
    ) -> None:
        self.resources = resources
        self.cfg = resources.settings.trainer
        self.model = model
        self.retrieval = retrieval
        self.sequence = sequence
        self.progress = progress
        self.group = group
        self.metrics = metrics
        self.shared = shared
        self.video_inputs = None if retrieval is None else VideoInputs(retrieval.towers.video)
        """The catalog's featurised videos, kept across exports (the towers' vectors are
        computed afresh at each)."""
        self.last_version: str | None = None
        self.batches_since = 0
        """Batches of records trained since the last export."""
        self.last_at = time.monotonic()
        """When the last export ran or failed (monotonic seconds)."""

    def process(self, batch: Batch) -> Batch:
        if batch.records:
            self.batches_since += 1
        return batch

    def due(self, now: float) -> bool:
        """Whether the timer or the batch count asks for an export (with something new
        to export: nothing trained since the last one, no export)."""
        cfg = self.cfg
        fresh = self.batches_since > 0
        by_time = cfg.export_every_s > 0 and now - self.last_at >= cfg.export_every_s and fresh
        by_count = cfg.export_every_batches > 0 and self.batches_since >= cfg.export_every_batches
        return (by_time or by_count) and self.metrics.samples_total > 0

    def leads(self) -> bool:
        """Whether this trainer is its group's exporter (alone, it always is): only it
        exports on its timer and answers *Export now* (``trainer/distributed.py``)."""
        return exports(self.group)

    def export(self, activate: bool | Literal["own_family"]) -> str:
        """Publish the current dense network as a registry version (with the towers and
        the sequence tower's newest refit, when there are)."""
        names: list[str] = []
        writers: list[Callable[[Path], None]] = []
        extra: dict[str, Any] = {"head_samples": dict(self.metrics.head_samples)}
        if self.retrieval is not None:
            names += ARTIFACTS
            writers.append(retrieval_writer(
                self.retrieval, self.resources.catalog.iter_all(), self.video_inputs
            ))
            extra[MANIFEST_KEY] = self.retrieval.towers.describe()
        published = None if self.sequence is None else self.sequence.for_export()
        if published is not None:
            max_len = self.resources.settings.sequence.max_len
            names += sequence_io.ARTIFACTS
            writers.append(sequence_writer(published, max_len))
            extra[sequence_io.MANIFEST_KEY] = sequence_io.describe(
                max_len, published.tower.dim, published.fits, published.weight
            )
        artifacts = (names, all_writers(writers)) if writers else None
        with self.shared.lock:
            version = publish(
                self.resources.registry,
                self.model,
                self.resources.schema,
                family=self.resources.settings.sparse.model_name,
                training_position={
                    "group_id": self.cfg.group_id,
                    "exporter": None if self.group is None else self.group.member,
                    "positions": {str(p): o for p, o in sorted(self.progress.positions.items())},
                    "events_total": self.metrics.events_total,
                    "samples_total": self.metrics.samples_total,
                    "checkpoint_seq": self.progress.seq,
                },
                metrics=self.metrics.window(),
                activate=activate,
                keep=self.cfg.registry_keep,
                extra=extra,
                artifacts=artifacts,
            )
        self.last_version = version
        self.last_at = time.monotonic()
        self.batches_since = 0
        log.info("exported %s (activate=%s)", version, activate)
        return version

    def failed(self, now: float) -> None:
        """An export failed at ``now``: the timer waits a full period before the next try."""
        self.last_at = now

    def save(self, checkpoint: Checkpoint) -> None:
        checkpoint.state["last_version"] = self.last_version

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None:
            self.last_version = checkpoint.state.get("last_version")

    def close(self) -> None:
        pass

