"""Sequence: the users' views for the sequence tower, and its refits (:mod:`trainer.sequence`).

Runs after the record stage, like the towers: the views of a batch are
added once it counts as trained. A refit takes seconds (ml-100k's 2,500
windows, 6 passes: about 9 s of one core), so online it runs on a thread of
its own and the trainer's thread only appends codes; in the evaluation's
replay (``sequence.background`` off) a due refit runs when the export asks
for the tower, so every figure is reproducible and point in time.
"""

from __future__ import annotations

import logging
import threading

from trainer.sequence import Published, SequenceTrainer
from trainer.stages.base import Batch, Checkpoint

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
"""How often the refit thread looks whether a refit is due (seconds)."""


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
        """The newest refit's tower. Refits first when one is due and none runs in the
        background, or when there has been none yet (the first is quick: few views), so
        the first version after the first views already carries a tower."""
        if not self.background or self.trainer.published is None:
            self._refit()
        return self.trainer.published

    def _refits(self) -> None:
        while not self._stop.is_set():
            if not self._refit():
                self._stop.wait(IDLE_WAIT_S)

    def _refit(self) -> bool:
        """A due refit (False: none was due, or it failed)."""
        try:
            return self.trainer.refit_if_due(self._stop)
        except Exception:  # a bug must not stop the ranker; the next due refit tries again
            self.failed += 1
            log.exception("sequence refit failed (%d so far)", self.failed)
            return False

    def save(self, checkpoint: Checkpoint) -> None:
        self.trainer.save(checkpoint.directory)

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None:
            self.trainer.restore(checkpoint.directory)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
