"""Operator actions: each recorded in the audit log before and after it runs.

Trainer actions (export, pause, resume, retrain, retrain_stop) go over the
control channel (:mod:`feature_store.control`) and end with the trainer's
final acknowledgement, or ``timeout`` when none came within
``dashboard.ack_timeout_s`` (no trainer listening, or it is stuck).

Registry actions (promote, rollback) are done here, on the shared registry,
and end once this service has hot-swapped to the new active version: if the
service refuses it (say, a version of a family whose sparse tables it cannot
find), the
pointer is put back and the action ``failed`` with the service's reason, so
an operator never leaves the registry pointing at a model nobody serves.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.dashboard.access import Operator
from app.dashboard.audit import AuditLog
from app.service import Service
from feature_store.control import LIVE, ControlChannel
from feature_store.control import Command as ControlCommand
from feature_store.errors import VidrecError
from feature_store.events import JsonInt
from feature_store.registry import VERSION_NAME

log = logging.getLogger(__name__)

Action = Literal["export", "pause", "resume", "promote", "rollback", "retrain", "retrain_stop"]
TRAINER_ACTIONS = ("export", "pause", "resume", "retrain", "retrain_stop")


_TARGET = r"^[A-Za-z0-9_-]{1,64}$"


class ActionRequest(BaseModel):
    """Body of ``POST /dashboard/api/actions/{action}``: what every action takes.

    Each action has its own route and body (the subclasses below), so the
    OpenAPI document says exactly which fields an action takes and needs.
    """

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)

    id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{8,64}$")
    """Chosen by the page so it can follow the command's acks while it runs."""


class TrainerActionRequest(ActionRequest):
    """Pause or resume: the live trainer or a retrain family."""

    target: str = Field(LIVE, pattern=_TARGET)
    """Trainer targeted: ``live`` or a retrain family's id."""


class ExportRequest(TrainerActionRequest):
    activate: bool = True
    """Activate the new version at once."""


class PromoteRequest(ActionRequest):
    version: str = Field(pattern=VERSION_NAME)
    """The version to activate (as listed on the dashboard and in ``GET /v1/status``)."""


class RetrainRequest(ActionRequest):
    from_ts_ms: JsonInt = Field(0, ge=0)
    """Replay the event log from this event time (ms since epoch); 0 (the default): from
    the oldest event the log still holds."""


class RetrainStopRequest(ActionRequest):
    target: str = Field(pattern=_TARGET)
    """The retrain family to stop."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def run_action(
    action: Action,
    body: ActionRequest,
    operator: Operator,
    service: Service,
    channel: ControlChannel,
    audit: AuditLog,
    timeout_s: float,
) -> dict[str, Any]:
    """Carry out ``action``; returns the outcome entry written to the audit log."""
    args = _args(body)
    target: str = getattr(body, "target", LIVE)
    command = ControlCommand(action, args, issuer=operator.label, target=target)
    if body.id:
        command = ControlCommand(action, args, operator.label, target, body.id)
    base = {
        "id": command.id, "actor": operator.name, "role": operator.role,
        "address": operator.address, "action": action, "target": target, "args": args,
    }
    audit.append({**base, "ts_ms": _now_ms(), "status": "requested", "message": ""})
    result: dict[str, Any] = {}
    try:
        if action == "promote":
            status, message, result = _promote(service, str(args["version"]), timeout_s)
        elif action == "rollback":
            status, message, result = _rollback(service, timeout_s)
        else:
            channel.send(command)
            ack = channel.wait(command.id, timeout_s)
            if ack is None:
                status = "timeout"
                message = f"no trainer acknowledged within {timeout_s:g} s (is one running?)"
            else:
                status, message, result = ack.status, ack.message, ack.result
    except VidrecError as exc:
        status, message = "failed", exc.message
    outcome = {
        **base, "ts_ms": _now_ms(), "status": status, "message": message, "result": result,
    }
    audit.append(outcome)
    log.info("dashboard: %s %s by %s: %s %s", action, command.id, operator.label, status, message)
    return outcome


def _args(body: ActionRequest) -> dict[str, Any]:
    """The command's arguments: the body's fields other than ``id`` and ``target``."""
    return body.model_dump(exclude={"id", "target"})


def _await_served(
    service: Service, version: str, timeout_s: float
) -> tuple[bool, str | None]:
    """(True, None) once the service serves ``version``; (False, reason) if it refused."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        model = service.model
        if model is not None and model.version == version:
            return True, None
        if version in service.holder.failed:
            return False, service.holder.failed[version]
        time.sleep(0.02)
    return False, f"not served within {timeout_s:g} s"


def _promote(service: Service, version: str, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    registry = service.resources.registry
    before = registry.active()
    registry.activate(version)  # NotFound for an unknown version
    served, reason = _await_served(service, version, timeout_s)
    if served:
        return "done", f"{version} is active and served", {"version": version, "previous": before}
    if registry.active() == version and before is not None:
        registry.rollback()  # never leave the pointer on a model nobody serves
    return "failed", f"{version} refused by the service ({reason}); {before} stays active", {}


def _rollback(service: Service, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    registry = service.resources.registry
    before = registry.active()
    version = registry.rollback()  # Conflict when there is nothing to go back to
    served, reason = _await_served(service, version, timeout_s)
    if served:
        return "done", f"rolled back from {before} to {version}", {
            "version": version, "previous": before,
        }
    return "failed", f"{version} is active but not served: {reason}", {"version": version}
