"""Record: a trained batch's progress, journal, group progress and audit trail.

Owns :class:`~trainer.stages.base.Progress` (``positions`` and
``log_times`` in a checkpoint), the trainer's running totals (``*_total``,
``head_samples``), the journal and the audit trail:

- **Journal** (``journal.jsonl``, durable sparse tables only): each batch's
  fresh event ids, appended once its pushes landed; a restart adds them to
  the dedupe window, so events redelivered after a push that no checkpoint
  covers are skipped (``docs/training.md``). Emptied by each checkpoint.
- **Audit** (``trainer.audit``): the ids trained up to each checkpoint, one
  file per checkpoint (``audit/<seq>.ids``), for the tests that prove no
  event trains twice.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from trainer.dedupe import DedupeWindow, id_hash
from trainer.distributed import GroupSync
from trainer.metrics import TrainerMetrics
from trainer.stages.base import Batch, Checkpoint, Progress, Shared
from trainer.stages.join import Join

log = logging.getLogger(__name__)

JOURNAL_FILE = "journal.jsonl"


class Record:
    """Advances :attr:`progress` past each batch of records; see the module doc."""

    def __init__(
        self,
        root: Path,
        progress: Progress,
        dedupe: DedupeWindow,
        join: Join,
        group: GroupSync | None,
        metrics: TrainerMetrics,
        shared: Shared,
        *,
        durable_sparse: bool,
        audit: bool,
    ) -> None:
        self.root = root
        self.progress = progress
        self.dedupe = dedupe
        """The decode stage's window, which a restart extends with the journal's ids."""
        self.join = join
        self.group = group
        self.metrics = metrics
        self.shared = shared
        self.durable_sparse = durable_sparse
        self.audit = audit
        self._trained_ids: list[str] = []
        """Event ids trained since the last checkpoint (kept only when audited)."""

    def process(self, batch: Batch) -> Batch:
        """A trained batch's positions, journal line (its fresh events), group progress,
        served-log progress and audit trail."""
        records = batch.records
        if not records:
            return batch
        ids = [e.event_id for e in batch.events]
        positions, log_times = self.progress.positions, self.progress.log_times
        for r in records:
            if r.offset + 1 > positions.get(r.partition, 0):
                positions[r.partition] = r.offset + 1
            if r.log_ts > log_times.get(r.partition, 0):
                log_times[r.partition] = r.log_ts
        if self.durable_sparse and ids:
            with open(self.root / JOURNAL_FILE, "a") as fh:
                fh.write(json.dumps(ids) + "\n")
        group = self.group
        if group is not None:  # the group's progress, right after the journal line
            if self.shared.retry(lambda: group.finish(records)):
                batch.samples = []  # another member trained it too: not the towers again
        self.join.trained_to(max(r.log_ts for r in records))
        if self.audit:
            self._trained_ids += ids
        return batch

    def save(self, checkpoint: Checkpoint) -> None:
        if self.audit:
            self._write_audit(checkpoint.seq)
        metrics = self.metrics
        checkpoint.state.update(
            positions={str(p): o for p, o in self.progress.positions.items()},
            log_times={str(p): t for p, t in self.progress.log_times.items()},
            events_total=metrics.events_total,
            samples_total=metrics.samples_total,
            batches_total=metrics.batches_total,
            head_samples=metrics.head_samples,
        )

    def saved(self) -> None:
        """The checkpoint is durable: it holds every id of the journal and the audit."""
        self._trained_ids = []
        (self.root / JOURNAL_FILE).unlink(missing_ok=True)

    def _write_audit(self, seq: int) -> None:
        audit = self.root / "audit"
        audit.mkdir(exist_ok=True)
        path = audit / f"{seq:010d}.ids"
        with open(path, "w") as fh:
            fh.write("".join(i + "\n" for i in self._trained_ids))
            fh.flush()
            os.fsync(fh.fileno())

    def restore(self, checkpoint: Checkpoint | None) -> None:
        """The checkpoint's progress and totals, then (for durable sparse tables) the
        journal's ids; audit segments of checkpoints that never became the latest go."""
        seq = None if checkpoint is None else checkpoint.seq
        audit = self.root / "audit"
        if audit.is_dir():  # segments of checkpoints that never became LATEST
            for path in audit.glob("*.ids"):
                if seq is None or int(path.stem) > seq:
                    path.unlink()
        if checkpoint is not None:
            state = checkpoint.state
            self.progress.positions = {int(p): int(o) for p, o in state["positions"].items()}
            self.progress.log_times = {
                int(p): int(t) for p, t in state.get("log_times", {}).items()
            }
            self.metrics.restore_totals(state)
        self._replay_journal()

    def _replay_journal(self) -> None:
        journal = self.root / JOURNAL_FILE
        if not journal.is_file():
            return
        if self.durable_sparse:
            ids: list[str] = []
            with open(journal) as fh:
                for line in fh:
                    try:
                        ids += json.loads(line)
                    except json.JSONDecodeError:
                        break  # torn last line: that batch's record was not finished
            self.dedupe.remember(id_hash(i) for i in ids)
            if self.audit:
                self._trained_ids += ids
            log.info("journal: %d event ids pushed after the checkpoint", len(ids))
            return  # kept until the next checkpoint holds these ids in its window
        journal.unlink()  # in-process tables: the checkpoint rolled those batches back

    def close(self) -> None:
        pass
