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
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

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
