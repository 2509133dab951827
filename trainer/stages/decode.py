"""Decode: the polled records' events that were never trained (dedupe, group claims).

Owns the dedupe window (``dedupe.npy`` in a checkpoint): the ids of the
``trainer.dedupe_window`` most recent events trained, so a redelivered
record (a restart between checkpoint and commit, a producer's retry) trains
once. In a group (:mod:`trainer.distributed`) it also drops the records
another member already claimed.
"""

from __future__ import annotations

import numpy as np

from trainer.checkpoint import DEDUPE_FILE
from trainer.dedupe import DedupeWindow
from trainer.distributed import GroupSync
from trainer.stages.base import Batch, Checkpoint, Shared


class Decode:
    """Fills :attr:`Batch.events` (and their partitions and log times)."""

    def __init__(self, dedupe: DedupeWindow, group: GroupSync | None, shared: Shared) -> None:
        self.dedupe = dedupe
        self.group = group
        self.shared = shared

    def process(self, batch: Batch) -> Batch:
        records = batch.records
        if not records:
            return batch
        fresh = self.dedupe.admit([r.event.event_id for r in records])
        group = self.group
        if group is not None:  # scale-out: drop what another member already trained
            fresh = self.shared.retry(lambda: group.unclaimed(records, fresh))
        batch.events = [records[i].event for i in fresh]
        batch.partitions = [records[i].partition for i in fresh]
        batch.log_times = [records[i].log_ts for i in fresh]
        return batch

    def save(self, checkpoint: Checkpoint) -> None:
        np.save(checkpoint.directory / DEDUPE_FILE, self.dedupe.to_array())

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None:
            self.dedupe.load_array(np.load(checkpoint.directory / DEDUPE_FILE))

    def close(self) -> None:
        pass
