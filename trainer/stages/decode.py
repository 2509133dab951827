"""Decode: the polled records' events that were never trained (dedupe, group claims).

Owns the dedupe window (``dedupe.npy`` in a checkpoint): the ids of the
``trainer.dedupe_window`` most recent events trained, so a redelivered
record (a restart between checkpoint and commit, a producer's retry) trains
once. In a group (:mod:`trainer.distributed`) it also claims the batch's
partitions, drops the records another member already trained, and gives back
(seeks the consumer back to) the records of partitions another member is
training now; and it drops a whole batch whose claim was taken before its
first write (:meth:`Decode.fence`, which the rank stage calls).

A record given back is as if never polled: its id leaves the dedupe window,
its partition's position is not advanced (so no commit passes it), and the
consumer reads it again, when it still owns the partition (else its new
owner reads it from the last commit).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from feature_store.errors import Conflict
from feature_store.eventlog.base import ConsumedEvent, Position
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
        if group is not None:  # scale-out: claim, and drop what another member trained
            try:
                claimed = self.shared.retry(lambda: group.claim(records, fresh))
            except BaseException:  # nothing of the batch trains: none of it was seen
                self.dedupe.forget([records[i].event.event_id for i in fresh])
                raise
            if claimed.busy:
                given = [records[i] for i in fresh if records[i].partition in claimed.busy]
                self.dedupe.forget([r.event.event_id for r in given])
                batch.records = self._give_back(batch, claimed.busy)
            fresh = claimed.kept
        batch.events = [records[i].event for i in fresh]
        batch.partitions = [records[i].partition for i in fresh]
        batch.log_times = [records[i].log_ts for i in fresh]
        return batch

    def fence(self, batch: Batch) -> bool:
        """Whether ``batch`` may write (its claims are still this member's: see
        :meth:`GroupSync.fence`); if not, the batch is emptied and its records given
        back, and the claims still held are released."""
        group = self.group
        if group is None or self.shared.retry(group.fence):
            return True
        self.dedupe.forget([e.event_id for e in batch.events])
        self._give_back(batch, {r.partition for r in batch.records})
        self.shared.retry(group.abandon)
        batch.records, batch.events, batch.partitions, batch.log_times = [], [], [], []
        batch.samples = []
        return False

    def _give_back(self, batch: Batch, partitions: Collection[int]) -> list[ConsumedEvent]:
        """Seek the consumer back to the first record of each of ``partitions`` it still
        owns; returns the batch's records of the other partitions."""
        records = batch.records
        consumer = batch.consumer
        if consumer is not None:
            firsts: dict[int, int] = {}
            for r in records:
                if r.partition in partitions and r.partition not in firsts:
                    firsts[r.partition] = r.offset
            owned = set(self.shared.retry(consumer.assignment))
            back = [Position(p, o) for p, o in sorted(firsts.items()) if p in owned]
            if back:
                try:
                    self.shared.retry(lambda: consumer.seek(back))
                except Conflict:
                    pass  # moved away meanwhile: the new owner reads them from the commit
        return [r for r in records if r.partition not in partitions]

    def save(self, checkpoint: Checkpoint) -> None:
        np.save(checkpoint.directory / DEDUPE_FILE, self.dedupe.to_array())

    def restore(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is not None:
            self.dedupe.load_array(np.load(checkpoint.directory / DEDUPE_FILE))

    def close(self) -> None:
        pass
