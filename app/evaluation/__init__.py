"""``vidrec eval``: quality of the online trainer and the live service on a replayed dataset.

- :mod:`~app.evaluation.stream`: datasets as events in event-time order, and the split;
- :mod:`~app.evaluation.feed`: positive-only logs: leave-one-out hold-out, added impressions;
- :mod:`~app.evaluation.metrics`: AUC (per sample, per moment), per-window curves, ranks;
- :mod:`~app.evaluation.baselines`: global and time-decayed popularity, item co-occurrence;
- :mod:`~app.evaluation.runner`: the replay through the real trainer and service;
- :mod:`~app.evaluation.results`: every model's figures on the same rows and queries;
- :mod:`~app.evaluation.report`: the table, the markdown section and the plot;
- :mod:`~app.evaluation.cli`: the ``vidrec eval`` arguments.

The trainers come in as :class:`~app.evaluation.runner.EvalTrainers`, built
by the composition root (``app.wiring.eval_trainers``), so this package never
imports ``trainer``. The re-exports are lazy so that ``vidrec --help`` does
not load the service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.evaluation.runner import EvalConfig, EvalResult, EvalTrainers, evaluate

__all__ = ["EvalConfig", "EvalResult", "EvalTrainers", "evaluate"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from app.evaluation import runner

        return getattr(runner, name)
    raise AttributeError(name)
