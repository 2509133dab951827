"""The composition root: builds a process from settings and hands each part its objects.

This is the one module allowed to import both ``app`` and ``trainer``
(``[tool.importlinter]`` in ``pyproject.toml``); everything else in ``app``
and ``trainer`` builds on ``feature_store`` alone. It imports ``trainer``
(and so torch) only inside the functions that need a trainer, so ``vidrec
serve`` never loads torch.

- ``vidrec up``: :func:`run_up`, the API with :func:`embedded_trainer` (which
  the service opens and stops) and the demo traffic (a lifespan extension),
  all on one set of resources.
- ``vidrec train``: :func:`run_train`, the trainer alone on its own resources.
- ``vidrec eval``: :func:`run_eval`, the evaluation with :func:`eval_trainers`
  (the online trainer driven in the caller's thread, and offline epochs).

Beside each trainer it starts a :class:`~trainer.control.ControlListener`
(the dashboard's actions) with a :class:`~trainer.retrain.RetrainManager`
(retrain families).
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from app.main import Extension
from app.metrics import Metrics
from app.service import InProcessTrainer
from feature_store.runtime.resources import Resources
from feature_store.settings import Settings

if TYPE_CHECKING:
    from app.evaluation.runner import EvalTrainers

log = logging.getLogger(__name__)

@contextmanager
def embedded_trainer(resources: Resources, metrics: Metrics) -> Iterator[InProcessTrainer]:
    """The online trainer, training in a background thread of the service's process, with
    its control listener and retrain families; :func:`app.service.open_service` opens it
    (``create_app(settings, trainer=embedded_trainer)``) and stops it first on exit."""
    from trainer.component import TrainerComponent
    from trainer.control import ControlListener
    from trainer.retrain import RetrainManager

    trainer = TrainerComponent(resources)
    trainer.start()
    log.info("embedded trainer started")
    retrainer = RetrainManager(TrainerComponent, resources)
    listener = ControlListener(resources.control, trainer, retrainer=retrainer)
    listener.start()
    try:
        with metrics.including(trainer.metrics_registry):  # vidrec_trainer_* on /metrics
            yield InProcessTrainer(trainer, retrainer)
    finally:
        listener.close()  # closes the retrainer too
        trainer.stop()


def embedded_extensions(demo: bool) -> list[Extension]:
    """What ``vidrec up`` runs inside the API's lifespan beside the service (and its
    :func:`embedded_trainer`): the demo's users with ``--demo``."""
    extensions: list[Extension] = []
    if demo:
        from app.demo import demo_traffic

        extensions.append(demo_traffic)
    return extensions


def run_up(settings: Settings, host: str, port: int, demo: bool = False) -> int:
    """``vidrec up``: API + trainer + embedded backends in one process."""
    from app.server import run_embedded

    if demo:
        from app.demo import demo_settings

        settings = demo_settings(settings)
    return run_embedded(
        settings, host, port, embedded_extensions(demo), trainer=embedded_trainer, demo=demo
    )


def run_train(settings: Settings) -> int:
    """``vidrec train``: the trainer alone, until SIGTERM/SIGINT (it checkpoints first)."""
    from feature_store.runtime import tracing
    from feature_store.runtime.resources import open_resources
    from trainer.component import TrainerComponent
    from trainer.control import ControlListener
    from trainer.retrain import RetrainManager

    with tracing.configured(settings.tracing, "trainer"), open_resources(settings) as resources:
        trainer = TrainerComponent(resources)
        signal.signal(signal.SIGTERM, lambda *_: trainer.stop())
        signal.signal(signal.SIGINT, lambda *_: trainer.stop())
        retrainer = RetrainManager(TrainerComponent, resources)
        with ControlListener(resources.control, trainer, retrainer=retrainer):
            trainer.run()  # the listener carries out the dashboard's actions
    return 0


def eval_trainers() -> EvalTrainers:
    """What ``vidrec eval`` (and its tests) train with: the real online and offline trainers."""
    from app.evaluation.runner import EvalTrainers
    from trainer.offline import OnlineReplay, train_offline

    return EvalTrainers(replay=OnlineReplay, offline=train_offline)


def run_eval(args: argparse.Namespace) -> int:
    """``vidrec eval``: trainer and service replayed in this process, beside baselines."""
    from app.evaluation.cli import run_eval as run

    return run(args, eval_trainers())
