"""The protocol every stage of the online trainer follows, and what flows between them.

The loop (:mod:`trainer.loop`) and the offline replay (:mod:`trainer.offline`)
run the same :class:`~trainer.stages.pipeline.Pipeline`: a list of stages,
each one step of a batch's way through the trainer (decode, join, rank,
towers, record, export) and the owner of the state that step keeps. A stage:

- ``process(batch) -> batch``: its step of one batch (a batch of polled
  records, or an *idle* batch: no records, the stream quiet, pending
  impressions resolved by the clock);
- ``save(checkpoint)`` / ``restore(checkpoint)``: its part of a checkpoint,
  as keys of the shared ``state.json`` and files of its own in the
  checkpoint's directory (dense networks and arrays are files, not JSON);
  ``restore(None)`` when there is no checkpoint to start from;
- ``close()``: releases what it opened (threads, connections), once.

A checkpoint is then the stages' parts gathered in order; nothing lists a
piece of state by hand outside the stage that owns it. The file and key
names are the ones :mod:`trainer.checkpoint` documents, unchanged by the
split, so checkpoints written before it restore.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from feature_store.eventlog.base import ConsumedEvent, EventConsumer
from feature_store.events import Event
from trainer.labels import Sample
from trainer.samples import Lookup

T = TypeVar("T")


class Retry(Protocol):
    """The loop's retry (:meth:`trainer.loop.OnlineTrainer.retry`): runs ``fn`` again on
    backend failures, with backoff, until it works or the loop stops."""

    def __call__(self, fn: Callable[[], T]) -> T: ...


@dataclass(frozen=True)
class Shared:
    """What every stage of one trainer shares."""

    retry: Retry
    lock: threading.Lock
    """Held while the networks change or are read whole (step, towers' step, scoring,
    export, checkpoint, group averaging): export runs on other threads' request."""


@dataclass
class Batch:
    """One batch on its way through the stages; each stage fills its fields.

    An idle batch (``idle_ms`` set, no records) carries no events: the join
    stage resolves the impressions older than the join window at ``idle_ms``
    (the clock of an idle stream), and the stages after it train what that gave.
    """

    records: list[ConsumedEvent]
    consumer: EventConsumer | None = None
    """The consumer that polled the records: the join follows the served partitions of
    its assignment (None: the replay, which follows none)."""
    idle_ms: int | None = None
    """Clock (ms) of an idle batch; None for a batch of records."""
    started: float = field(default_factory=time.perf_counter)
    events: list[Event] = field(default_factory=list)
    """The records' events not trained before (decode: dedupe, group claims)."""
    partitions: list[int] = field(default_factory=list)
    log_times: list[int] = field(default_factory=list)
    """Partition and log time (ms) of each of :attr:`events`."""
    lookup: Lookup | None = None
    """The events' catalog records (join; the rank stage records the activity with them)."""
    samples: list[Sample] = field(default_factory=list)
    """Labelled samples (join), trained by the rank and towers stages."""
    unique_keys: int = 0
    """Unique sparse keys of the ranker's step (rank)."""

    @classmethod
    def idle(cls, now_ms: int) -> Batch:
        return cls(records=[], idle_ms=now_ms)

    @property
    def duplicates(self) -> int:
        return len(self.records) - len(self.events)


@dataclass
class Progress:
    """How far the trainer got: owned (and checkpointed) by the record stage, read by the
    join stage (where to resume the served log) and the loop (the offsets it commits)."""

    positions: dict[int, int] = field(default_factory=dict)
    """Next offset per partition after the last trained batch."""
    log_times: dict[int, int] = field(default_factory=dict)
    """Log time (ms) of the newest record trained per partition: where a restarted
    trainer resumes reading the served log (minus its join window)."""
    seq: int = 0
    """Sequence number of the last checkpoint written or loaded (0: none)."""


@dataclass
class Checkpoint:
    """One checkpoint as the stages see it, to write or to read."""

    seq: int
    directory: Path
    """Where a stage writes (reads) its files."""
    state: dict[str, Any]
    """``state.json``: each stage's keys side by side (so names must not clash)."""
    same_schema: bool = True
    """Whether it was written for this trainer's feature schema: if not, what depends on
    the columns (dense networks, packed values) starts afresh and the rest is kept."""


class Stage(Protocol):
    """One step of the trainer and its state (see the module doc)."""

    def process(self, batch: Batch) -> Batch: ...

    def save(self, checkpoint: Checkpoint) -> None: ...

    def restore(self, checkpoint: Checkpoint | None) -> None: ...

    def close(self) -> None: ...
