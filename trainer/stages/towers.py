"""Towers: the two-tower retrieval model trained beside the ranker (:mod:`trainer.retrieval`).

Owns :class:`~trainer.retrieval.RetrievalTrainer` (its networks, optimizer,
frequency estimate and buffered positives; its own files in a checkpoint,
dropped when written for another schema). Runs after the record stage: a
crash in between loses a step of the towers, never trains an event twice.
"""

from __future__ import annotations

from trainer.retrieval import RetrievalTrainer
from trainer.stages.base import Batch, Checkpoint, Shared


class Towers:
    """Buffers the batch's positives; trains the towers on full buffers."""

    def __init__(self, retrieval: RetrievalTrainer, shared: Shared) -> None:
        self.retrieval = retrieval
        self.shared = shared

    def process(self, batch: Batch) -> Batch:
        if batch.samples:
            self.retrieval.add(batch.samples)
        if batch.idle_ms is not None:
            return batch  # the idle flush's positives train with the next batch's
        # After the ranker's pushes settled: the tower tables are pulled and pushed
        # synchronously, never beside them.
        with self.shared.lock:
            while self.retrieval.step():
                pass
        return batch

    def save(self, checkpoint: Checkpoint) -> None:
        self.retrieval.save(checkpoint.directory)

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None and checkpoint.same_schema:
            self.retrieval.restore(checkpoint.directory)

    def close(self) -> None:
        pass
