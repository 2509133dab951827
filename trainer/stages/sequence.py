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

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from feature_store.factors.base import FactorStore
from feature_store.settings import FactorizationSettings, SequenceSettings
from trainer.factorization import LiveFactorization
from trainer.sequence import Published, SequenceTrainer, Started, chosen_views
from trainer.sequence_share import READ_AT_MOST, SharedViews
from trainer.sequence_worker import RemoteFit
from trainer.stages.base import Batch, Checkpoint

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
"""How often the refit thread looks whether a refit is due (seconds)."""
SHARE_FILE = "sequence_share.json"
"""In a checkpoint: the group stream's position the saved views hold."""
FAILED_WAIT_S = 30.0
"""How long the refit thread waits after a failed refit (a worker that cannot start is
not started again every second)."""


def sequence_stage(
    settings: SequenceSettings,
    seed: int,
    shared: SharedViews | None = None,
    leads: Callable[[], bool] = lambda: True,
    factorization: tuple[FactorizationSettings, FactorStore] | None = None,
) -> SequenceStage:
    """The stage ``settings`` describe, its refits in a worker process; with
    ``factorization``, the live factorisation of its views too (:mod:`trainer.factorization`)."""
    trainer = SequenceTrainer(settings, seed, RemoteFit(settings, seed))
    live = None
    if factorization is not None:
        live = LiveFactorization(factorization[0], trainer, factorization[1], seed)
    return SequenceStage(trainer, shared, leads, live)


class SequenceStage:
    """Adds each batch's chosen videos; refits on its thread (or at the export).

    In a group (``shared``, :mod:`trainer.sequence_share`) the batch's views go to the
    group's stream and every member's come back from it on the refit thread; only
    the member that ``leads`` (the exporter) refits."""

    def __init__(
        self,
        trainer: SequenceTrainer,
        shared: SharedViews | None = None,
        leads: Callable[[], bool] = lambda: True,
        factorization: LiveFactorization | None = None,
    ) -> None:
        self.trainer = trainer
        self.factorization = factorization
        """The live factorisation of the same views (None: off): stepped after each batch
        in the replay, on its own thread online."""
        self.shared = shared
        self.leads = leads
        self.background = trainer.settings.background or shared is not None
        self.failed = 0
        self._pending: Started | None = None
        """Paced by the exports: the refit the last export started."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def process(self, batch: Batch) -> Batch:
        if batch.samples:
            if self.shared is None:
                self.trainer.add(batch.samples)
            else:
                self.trainer.keep_for_fusion(batch.samples)
                views = chosen_views(batch.samples)
                if not self.shared.publish(views):
                    self.trainer.add_views(views)  # Redis down: this member's tower has them
            self._factorize()
        if self.background and self._thread is None and (batch.samples or self.shared):
            self._thread = threading.Thread(
                target=self._refits, name="vidrec-sequence-refit", daemon=True
            )
            self._thread.start()
            if self.factorization is not None:
                self.factorization.start(self.leads)
        return batch

    def _factorize(self) -> None:
        """New views: the factorisation folds them in (at once in the replay, on its
        thread online)."""
        if self.factorization is None:
            return
        if self.background:
            self.factorization.wake()
        else:
            self.factorization.step()

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
            self._read_shared()
            if not self._refit():
                self._stop.wait(FAILED_WAIT_S if self.failed > failed else IDLE_WAIT_S)

    def _read_shared(self) -> None:
        """Every member's views appended to the group's stream since the last read."""
        while self.shared is not None and not self._stop.is_set():
            views = self.shared.read()
            self.trainer.add_views(views)
            if views and self.factorization is not None:
                self.factorization.wake()
            if len(views) < READ_AT_MOST:
                return
            time.sleep(0)  # a backlog: let the trainer's thread in between pages

    def _refit(self) -> bool:
        """A due refit (False: none was due, this member does not lead, or it failed)."""
        if not self.leads():
            return False
        try:
            return self.trainer.refit_if_due(self._stop)
        except Exception:  # a bug must not stop the ranker; the next due refit tries again
            self.failed += 1
            log.exception("sequence refit failed (%d so far)", self.failed)
            return False

    def status(self) -> dict[str, Any]:
        """The tower's figures (views, refits, the last loss and refit time) and failures;
        in a group, the shared views' counts."""
        shared = {} if self.shared is None else {"shared_views": self.shared.status()}
        factors = ({} if self.factorization is None
                   else {"factorization": self.factorization.status()})
        return {**self.trainer.status(), "failed_refits": self.failed,
                "background": self.background, **shared, **factors}

    def save(self, checkpoint: Checkpoint) -> None:
        # The stream position first: the views saved then hold at least what it read (a
        # view read again after a restore moves to where it was: no change).
        position = None if self.shared is None else self.shared.last_id
        self.trainer.save(checkpoint.directory)
        if position is not None:
            (checkpoint.directory / SHARE_FILE).write_text(json.dumps({"position": position}))

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            return
        self.trainer.restore(checkpoint.directory)
        saved = checkpoint.directory / SHARE_FILE
        if self.shared is not None and saved.is_file():
            self.shared.last_id = str(json.loads(saved.read_text())["position"])

    def close(self) -> None:
        self._stop.set()
        if self.factorization is not None:
            self.factorization.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.trainer.close()
