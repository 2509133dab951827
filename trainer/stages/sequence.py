"""Sequence: the users' views for the sequence tower, and its refits (:mod:`trainer.sequence`).

Runs after the record stage, like the towers: the views of a batch are
added once it counts as trained. A refit takes seconds and runs in a worker
process (:mod:`trainer.sequence_worker`); the trainer's thread only appends
codes. Online (``sequence.background``) a thread of this stage starts each
refit when it is due and publishes it when done. In the evaluation's replay
(off) the exports pace the refits: a due refit starts at an export and is
published at the next one, whatever the machine's speed, so every figure is
reproducible and point in time, and the worker trains while the replay goes on.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from feature_store.settings import SequenceSettings
from trainer.sequence import Published, SequenceTrainer, Started
from trainer.sequence_worker import RemoteFit
from trainer.stages.base import Batch, Checkpoint

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
"""How often the refit thread looks whether a refit is due (seconds)."""
FAILED_WAIT_S = 30.0
"""How long the refit thread waits after a failed refit (a worker that cannot start is
not started again every second)."""


def sequence_stage(settings: SequenceSettings, seed: int) -> SequenceStage:
    """The stage ``settings`` describe, its refits in a worker process."""
    return SequenceStage(SequenceTrainer(settings, seed, RemoteFit(settings, seed)))


class SequenceStage:
    """Adds each batch's chosen videos; refits on its thread (or at the export)."""

    def __init__(self, trainer: SequenceTrainer) -> None:
        self.trainer = trainer
        self.background = trainer.settings.background
        self.failed = 0
        self._pending: Started | None = None
        """Paced by the exports: the refit the last export started."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def process(self, batch: Batch) -> Batch:
        if batch.samples:
            self.trainer.add(batch.samples)
            if self.background and self._thread is None:
                self._thread = threading.Thread(
                    target=self._refits, name="vidrec-sequence-refit", daemon=True
                )
                self._thread.start()
        return batch

    def for_export(self) -> Published | None:
        """The newest refit's tower. Paced by the exports (not in the background): the
        refit the last export started is published first, and a due one started."""
        if not self.background:
            self._pace()
        return self.trainer.published

    def _pace(self) -> None:
        try:
            pending, self._pending = self._pending, None
            if pending is not None:
                self.trainer.finish(pending, self._stop)
            if self.trainer.due():
                self._pending = self.trainer.begin()
        except Exception:  # a bug must not stop the ranker; the next export tries again
            self.failed += 1
            log.exception("sequence refit failed (%d so far)", self.failed)

    def _refits(self) -> None:
        while not self._stop.is_set():
            failed = self.failed
            if not self._refit():
                self._stop.wait(FAILED_WAIT_S if self.failed > failed else IDLE_WAIT_S)

    def _refit(self) -> bool:
        """A due refit (False: none was due, or it failed)."""
        try:
            return self.trainer.refit_if_due(self._stop)
        except Exception:  # a bug must not stop the ranker; the next due refit tries again
            self.failed += 1
            log.exception("sequence refit failed (%d so far)", self.failed)
            return False

    def status(self) -> dict[str, Any]:
        """The tower's figures (views, refits, the last loss and refit time) and failures."""
        return {**self.trainer.status(), "failed_refits": self.failed,
                "background": self.background}

    def save(self, checkpoint: Checkpoint) -> None:
        self.trainer.save(checkpoint.directory)

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None:
            self.trainer.restore(checkpoint.directory)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.trainer.close()
