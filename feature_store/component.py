"""What the service and the CLI may ask of a trainer without importing it.

``app`` and ``trainer`` never import each other. The trainer package
registers a factory under the ``vidrec.components`` entry point (see
``pyproject.toml``); :func:`load_trainer_factory` finds it, so ``vidrec up``
can run a trainer in the service's process (embedded mode) and ``vidrec
train`` can run one alone, while the serving path never imports torch unless
the embedded trainer is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from feature_store.errors import ConfigurationError

if TYPE_CHECKING:
    from feature_store.runtime import Resources

ENTRY_POINT_GROUP = "vidrec.components"
TRAINER_ENTRY_POINT = "trainer"


@runtime_checkable
class TrainerHandle(Protocol):
    """A running (or runnable) online trainer."""

    def start(self) -> None:
        """Train in a background thread until :meth:`stop`."""
        ...

    def run(self) -> None:
        """Train in the calling thread until stopped (SIGTERM / :meth:`stop`)."""
        ...

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop fetching, finish and commit the batch in flight, checkpoint."""
        ...

    def status(self) -> dict[str, Any]:
        """State (running, paused, stopped), counters and latest metrics."""
        ...

    def export_now(self, activate: bool = True) -> str:
        """Export the current dense network as a new version; returns its name."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


TrainerFactory = Callable[["Resources"], TrainerHandle]


def load_trainer_factory() -> TrainerFactory:
    """The installed trainer's factory, found through its entry point."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == TRAINER_ENTRY_POINT:
            factory: TrainerFactory = ep.load()
            return factory
    raise ConfigurationError(
        f"no {ENTRY_POINT_GROUP}:{TRAINER_ENTRY_POINT} entry point: is vidrec installed "
        "(pip install -e .)?"
    )


# --- evaluation (``vidrec eval``) -----------------------------------------

REPLAY_ENTRY_POINT = "replay"
OFFLINE_ENTRY_POINT = "offline"


@dataclass
class ScoredSamples:
    """Training samples with their labels, loss weights and predicted probabilities, aligned."""

    event_ids: list[str]
    """The event that carries each label (the trainer's ``Sample.event``)."""
    user_ids: list[str]
    video_ids: list[str]
    ts_ms: npt.NDArray[np.int64]
    labels: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]
    """Online: scored before the step that trains on them (prequential)."""

    @classmethod
    def concat(cls, parts: list[ScoredSamples]) -> ScoredSamples:
        """One set from several, in order."""
        return cls(
            event_ids=[i for p in parts for i in p.event_ids],
            user_ids=[i for p in parts for i in p.user_ids],
            video_ids=[i for p in parts for i in p.video_ids],
            ts_ms=np.concatenate([p.ts_ms for p in parts] or [np.zeros(0, np.int64)]),
            labels=np.concatenate([p.labels for p in parts] or [np.zeros(0)]),
            weights=np.concatenate([p.weights for p in parts] or [np.zeros(0)]),
            scores=np.concatenate([p.scores for p in parts] or [np.zeros(0)]),
        )

    def take(self, index: list[int]) -> ScoredSamples:
        """The samples at ``index``, in that order."""
        idx = np.asarray(index, dtype=np.int64)
        return ScoredSamples(
            event_ids=[self.event_ids[i] for i in index],
            user_ids=[self.user_ids[i] for i in index],
            video_ids=[self.video_ids[i] for i in index],
            ts_ms=self.ts_ms[idx], labels=self.labels[idx],
            weights=self.weights[idx], scores=self.scores[idx],
        )


@runtime_checkable
class ReplayHandle(Protocol):
    """The online trainer consuming the event log in the caller's thread (evaluation)."""

    def drain(self) -> ScoredSamples:
        """Train on every event produced so far; the samples trained, scored before training."""
        ...

    def export(self) -> str:
        """Export and activate the current network; returns the version."""
        ...

    def heads(self) -> dict[str, float]:
        """The other ranking heads' prequential figures over the trainer's window, with
        their popularity baselines (``negative_auc``, ``watch_spearman``...: see
        ``trainer/metrics.py``)."""
        ...

    def close(self) -> None: ...


@dataclass
class OfflineResult:
    """An offline-trained Wide&Deep: scores on the test rows and the epochs it ran."""

    test: ScoredSamples
    """Scores of the epoch with the best validation AUC."""
    epochs: list[dict[str, float]]
    """Per epoch: ``epoch``, ``train_loss``, ``valid_auc``, ``seconds``."""
    best_epoch: int


ReplayFactory = Callable[["Resources"], ReplayHandle]
OfflineTrainer = Callable[..., OfflineResult]
"""``(resources, events, train_ids, valid_ids, test_ids, *, max_epochs, patience, seed)``."""


def load_component(name: str) -> Any:
    """The object registered as ``vidrec.components:<name>`` (e.g. ``replay``, ``offline``)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    raise ConfigurationError(
        f"no {ENTRY_POINT_GROUP}:{name} entry point: is vidrec installed (pip install -e .)?"
    )
