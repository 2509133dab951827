"""Sequence: the users' views for the sequence tower, and its refits (:mod:`trainer.sequence`).

Runs after the record stage, like the towers: the views of a batch are
added once it counts as trained. A refit takes seconds, so online a thread of
this stage waits for it while a worker process trains
(:mod:`trainer.sequence_worker`), and the trainer's thread only appends
codes; in the evaluation's replay (``sequence.background`` off) a due refit
runs in this process when the export asks for the tower, so every figure is
reproducible and point in time.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from feature_store.settings import SequenceSettings
from trainer.sequence import Published, SequenceTrainer
from trainer.sequence_worker import RemoteFit
from trainer.stages.base import Batch, Checkpoint

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
"""How often the refit thread looks whether a refit is due (seconds)."""
FAILED_WAIT_S = 30.0
"""How long the refit thread waits after a failed refit (a worker that cannot start is
not started again every second)."""


def sequence_stage(settings: SequenceSettings, seed: int) -> SequenceStage:
    """The stage ``settings`` describe: refits in a worker process when in the background."""
    fitter = RemoteFit(settings, seed) if settings.background else None
    return SequenceStage(SequenceTrainer(settings, seed, fitter))


class SequenceStage:
    """Adds each batch's chosen videos; refits on its thread (or at the export)."""

    def __init__(self, trainer: SequenceTrainer) -> None:
        self.trainer = trainer
        self.background = trainer.settings.background
        self.failed = 0
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
        """The newest refit's tower (refit first when one is due and none runs in the
        background)."""
        if not self.background:
            self._refit()
        return self.trainer.published

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
