"""Which arm a user is in, and the model that serves it.

:class:`ArmModels` follows the experiment book (:mod:`feature_store.experiments`)
and the registry from a background thread, like the model holder follows
``ACTIVE``: for the running experiment it resolves each arm's version, loads
and warms the ones it lacks off the request path (against their family's
sparse tables, with the holder's own loader), then publishes the new arm
table by one reference assignment. A request reads it once
(:meth:`ArmModels.assign`): one hash and a lookup, no allocation.

An arm's version: the arm whose family is the active version's family gets
exactly what users outside the experiment get (the holder's current model,
so a rollback or a new export reaches it at the same time); another family's
arm gets that family's newest version in the registry (its trainer keeps
exporting; a failed load is remembered and not retried, and the previous
version, if any, keeps serving). An arm with no loadable version yet has no
assignment: its users get the active version and their responses carry no
arm, so they count for no arm (``vidrec_experiment_requests_total{outcome=
"unavailable"}`` says how many).

An arm's fusion weights (``Arm.fusion``) travel the same way: one more field
of :class:`Assignment`, read by the scorer with the model
(``docs/experiments.md``); an arm without them is scored with
``api.ranking_weights``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from app.scoring.fusion import Fusion
from app.scoring.onnx_model import LoadedModel, ModelHolder
from feature_store.errors import ConfigurationError, VidrecError
from feature_store.experiments import (
    Experiment,
    ExperimentStore,
    arm_index,
    salt_bytes,
    thresholds,
)
from feature_store.models.registry import ModelRegistry
from feature_store.runtime.worker import periodic
from feature_store.served import ServedArm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """A user's arm and what serves it (built once per arm and version, shared by requests)."""

    experiment: str
    arm: str
    model: LoadedModel
    tag: ServedArm
    """The arm as the served log records it."""
    fusion: Fusion | None = None
    """The arm's weights over the ranking heads (None: the service's)."""


@dataclass(frozen=True)
class _Running:
    experiment: Experiment
    salt: bytes
    bounds: tuple[int, ...]
    assignments: tuple[Assignment | None, ...]
    """Per arm; None while the arm has no model (its users get the active version)."""
    reasons: tuple[str | None, ...]
    """Per arm, why it has no model."""
    served: tuple[Any, ...]
    unavailable: tuple[Any, ...]
    """Per arm, the request counters' children (bound once: no label lookup per request)."""


class ArmModels:
    """The running experiment's arms and their models (see the module docstring)."""

    def __init__(
        self,
        store: ExperimentStore,
        registry: ModelRegistry,
        holder: ModelHolder,
        loader: Callable[[str], LoadedModel],
        poll_interval_s: float,
        metrics: CollectorRegistry,
    ) -> None:
        self.store = store
        self.registry = registry
        self.holder = holder
        self.loader = loader
        self.poll_interval_s = poll_interval_s
        self.current: _Running | None = None
        self.failed: dict[str, str] = {}
        """Versions that failed to load, with the reason (not retried)."""
        self.last_error: str | None = None
        self._loaded: dict[str, LoadedModel] = {}
        self.requests = Counter(
            "vidrec_experiment_requests",
            "Recommendations of users in an experiment, by arm and outcome (served by the "
            "arm's model; unavailable: the arm had no model, the active version answered)",
            ["experiment", "arm", "outcome"],
            registry=metrics,
        )
        self._worker = periodic("vidrec-arms", lambda: self.poll_interval_s, self.poll_once)
        self._lock = threading.Lock()

    # --- the request path -----------------------------------------------------

    def assign(self, user_id: str) -> Assignment | None:
        """The user's arm when an experiment runs and the arm has a model, else None."""
        running = self.current
        if running is None:
            return None
        index = arm_index(running.salt, user_id, running.bounds)
        assigned = running.assignments[index]
        if assigned is None:
            running.unavailable[index].inc()
        else:
            running.served[index].inc()
        return assigned

    # --- following the book and the registry ------------------------------------

    def poll_once(self) -> None:
        """Resolve the running experiment's arms now (loads happen here, not in requests)."""
        with self._lock:
            try:
                experiment = self.store.running()
            except VidrecError as exc:
                self.last_error = str(exc)  # keep the arms as they were
                return
            self.last_error = None
            if experiment is None:
                self.current = None
                self._loaded.clear()
                return
            models, reasons = self._resolve(experiment)
            current = self.current
            if (
                current is not None
                and current.experiment == experiment
                and all(
                    (a.model if a else None) is m
                    for a, m in zip(current.assignments, models, strict=True)
                )
            ):
                return
            self.current = self._publish(experiment, models, reasons)
            self._loaded = {m.version: m for m in models if m is not None}
            log.info(
                "experiment %s: %s", experiment.id,
                ", ".join(f"{arm.name}={m.version if m else reason}" for arm, m, reason
                          in zip(experiment.arms, models, reasons, strict=True)),
            )

    def _resolve(
        self, experiment: Experiment
    ) -> tuple[list[LoadedModel | None], list[str | None]]:
        active = self.holder.current
        active_family = active.manifest.family if active is not None else None
        models: list[LoadedModel | None] = []
        reasons: list[str | None] = []
        for arm in experiment.arms:
            if arm.family == active_family:
                models.append(active)
                reasons.append(None)
                continue
            version = self.registry.latest_of(arm.family)
            model, reason = self._model(version, arm.family)
            models.append(model)
            reasons.append(reason)
        return models, reasons

    def _model(self, version: str | None, family: str) -> tuple[LoadedModel | None, str | None]:
        if version is None:
            return None, f"no version of family {family!r} in the registry"
        known = self._loaded.get(version)
        if known is not None:
            return known, None
        if version not in self.failed:
            try:
                return self.loader(version), None
            except (VidrecError, ConfigurationError) as exc:
                self.failed[version] = str(exc)
                log.error("experiment arm version %s failed to load: %s", version, exc)
        # The family's previous version (if one was loaded) serves until a new one loads.
        earlier = [m for m in self._loaded.values() if m.manifest.family == family]
        return (earlier[0], None) if earlier else (None, self.failed[version])

    def _publish(
        self,
        experiment: Experiment,
        models: list[LoadedModel | None],
        reasons: list[str | None],
    ) -> _Running:
        arms = experiment.arms
        return _Running(
            experiment=experiment,
            salt=salt_bytes(experiment),
            bounds=thresholds(arms),
            assignments=tuple(
                Assignment(
                    experiment.id, arm.name, m, ServedArm(experiment.id, arm.name),
                    Fusion.of(arm.fusion) if arm.fusion is not None else None,
                )
                if m is not None else None
                for arm, m in zip(arms, models, strict=True)
            ),
            reasons=tuple(reasons),
            served=tuple(self.requests.labels(experiment.id, a.name, "served") for a in arms),
            unavailable=tuple(
                self.requests.labels(experiment.id, a.name, "unavailable") for a in arms
            ),
        )

    def describe(self) -> dict[str, Any] | None:
        """The running experiment's arms as this process serves them (the dashboard)."""
        running = self.current
        if running is None:
            return None
        return {
            "id": running.experiment.id,
            "arms": {
                arm.name: {
                    "version": assigned.model.version if assigned else None,
                    "unavailable": reason,
                }
                for arm, assigned, reason in zip(
                    running.experiment.arms, running.assignments, running.reasons, strict=True
                )
            },
        }

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self.poll_once()
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()
