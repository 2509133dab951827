"""The dashboard's experiments: their figures, and the start / stop / conclude actions.

Actions are audited like every other one (:func:`app.dashboard.actions.run_action`
calls :func:`run_experiment_action`):

- ``experiment_start``: adds a running experiment to the book
  (:mod:`feature_store.experiments`); refused while another one runs, for an
  id used before, or when an arm's family has no version in the registry yet
  (its users would get the active version: nothing to compare);
- ``experiment_stop``: ends it, no winner: every user gets the active version;
- ``experiment_conclude`` (promote the winner): makes the winning arm's
  version the active one for everyone (the registry's ``ACTIVE``, done once
  this replica serves it, put back if the service refuses it), then ends the
  experiment with that winner. The winner's family is the active family from
  then on: its trainer's exports are activated automatically, the other
  families' are not (``trainer/export.py``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import Field

from app.dashboard.actions import ActionRequest
from app.experiments.stats import summarize
from app.experiments.tally import merged
from app.service import Service
from feature_store.errors import Conflict, InvalidInput, VidrecError
from feature_store.experiments import NAME, Experiment, ExperimentSpec

SHOWN_ENDED = 10
"""Ended experiments shown on the page (newest first)."""


class ExperimentStartRequest(ActionRequest):
    experiment: ExperimentSpec
    """The experiment: its id, its arms (the first is the control) and an optional salt."""


class ExperimentStopRequest(ActionRequest):
    experiment: str = Field(pattern=NAME)
    """The running experiment's id."""


class ExperimentConcludeRequest(ExperimentStopRequest):
    arm: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    """The winning arm: its family's version becomes the active one for everyone."""


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run_experiment_action(
    service: Service,
    action: str,
    args: dict[str, Any],
    issuer: str,
    promote: Any,
    timeout_s: float,
) -> tuple[str, str, dict[str, Any]]:
    """Carry out an experiment action: ``(status, message, result)`` for the audit log.

    ``promote(service, version, timeout_s)`` is the dashboard's promotion coroutine
    (activate, wait until served, put the pointer back if refused). The book's reads
    and writes (a file and a lock) run in a thread, like the other actions' blocking steps.
    """
    store = service.experiments
    assert store is not None
    if action == "experiment_start":
        spec = ExperimentSpec.model_validate(args["experiment"])
        await asyncio.to_thread(_check_versions, service, spec)
        experiment = await asyncio.to_thread(store.start, spec, issuer, _now_ms())
        return "done", f"experiment {spec.id} started", {"experiment": experiment.id}
    experiment = await asyncio.to_thread(store.get, str(args["experiment"]))
    if action == "experiment_stop":
        await asyncio.to_thread(store.end, experiment.id, issuer, _now_ms())
        return "done", f"experiment {experiment.id} stopped; everyone is on the active version", {
            "experiment": experiment.id,
        }
    arm = experiment.arm(str(args["arm"]))
    if experiment.status != "running":
        raise Conflict(f"experiment {experiment.id} is {experiment.status}, not running")
    version = await asyncio.to_thread(_arm_version, service, experiment, arm.name)
    active = await asyncio.to_thread(service.resources.registry.active)
    if version != active:
        status, message, result = await promote(service, version, timeout_s)
        if status != "done":
            return status, f"{arm.name} not promoted: {message}", result
    await asyncio.to_thread(
        store.end, experiment.id, issuer, _now_ms(), arm.name, version
    )
    return "done", f"{arm.name} won: {version} ({arm.family}) is active for everyone", {
        "experiment": experiment.id, "winner": arm.name, "version": version, "previous": active,
    }


def _check_versions(service: Service, spec: ExperimentSpec) -> None:
    registry = service.resources.registry
    model = service.model
    active_family = model.manifest.family if model is not None else None
    for i, arm in enumerate(spec.arms):
        if arm.family != active_family and registry.latest_of(arm.family) is None:
            raise InvalidInput(
                f"experiment.arms.{i}.family",
                f"no version of family {arm.family!r} in the registry (export one first)",
            )


def _arm_version(service: Service, experiment: Experiment, arm: str) -> str:
    """The version the arm serves here now (else its family's newest)."""
    served = service.arms.describe() if service.arms is not None else None
    if served is not None and served["id"] == experiment.id:
        version = served["arms"].get(arm, {}).get("version")
        if version:
            return str(version)
    family = experiment.arm(arm).family
    model = service.model
    if model is not None and model.manifest.family == family:
        return model.version
    latest = service.resources.registry.latest_of(family)
    if latest is None:
        raise InvalidInput("arm", f"family {family!r} has no version to promote")
    return latest


def experiments_view(service: Service) -> dict[str, Any]:
    """The running experiment and the newest ended ones, each arm with its figures."""
    store = service.experiments
    if store is None:
        return {"running": None, "ended": []}
    try:
        book = store.all()
        states = service.experiment_checkpoints.load() if service.experiment_checkpoints else {}
    except VidrecError as exc:
        return {"running": None, "ended": [], "error": exc.message}
    totals = merged(list(states.values()))
    arms = service.arms.describe() if service.arms is not None else None
    feed = service.experiment_feed

    def describe(experiment: Experiment) -> dict[str, Any]:
        rows = summarize(experiment, totals.get(experiment.id, {}))
        if arms is not None and arms["id"] == experiment.id:
            for row in rows:
                row.update(arms["arms"].get(row["arm"], {}))
        return {**experiment.model_dump(mode="json", exclude={"arms"}), "arms": rows}

    running = next((e for e in book if e.status == "running"), None)
    ended = [e for e in reversed(book) if e.status != "running"][:SHOWN_ENDED]
    return {
        "running": describe(running) if running is not None else None,
        "ended": [describe(e) for e in ended],
        "feed": feed.status() if feed is not None else None,
        "window_ms": service.resources.settings.experiments.attribution_window_ms,
    }
