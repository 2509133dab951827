"""Operator actions: each recorded in the audit log before and after it runs.

Actions run as coroutines (:class:`ActionRunner`): waiting for a trainer or
a hot swap holds no thread. An id names one action (409 on reuse with another
request), and at most ``dashboard.max_pending_actions`` wait at once (429).

Trainer actions (export, pause, resume, retrain, retrain_stop) go over the
control channel (:mod:`feature_store.ops.control`) and end with the trainer's
final acknowledgement, or ``timeout`` when none came within
``dashboard.ack_timeout_s`` (no trainer listening, or it is stuck). An
export that activated its version ends once this service serves it
(:func:`_export_served`).

Experiment actions (start, stop, conclude: promote the winner) are done by
:mod:`app.dashboard.experiments`, on the experiment book and the registry.

Registry actions (promote, rollback) are done here, on the shared registry,
and end once this service has hot-swapped to the new active version: if the
service refuses it (say, a version of a family whose sparse tables it cannot
find), the
pointer is put back and the action ``failed`` with the service's reason, so
an operator never leaves the registry pointing at a model nobody serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.dashboard.access import Operator
from app.dashboard.audit import AuditLog
from app.service import Service
from feature_store.errors import Conflict, TooManyRequests, VidrecError
from feature_store.events import JsonInt
from feature_store.models.registry import VERSION_NAME, Manifest
from feature_store.ops.control import LIVE, Ack, ControlChannel
from feature_store.ops.control import Command as ControlCommand

log = logging.getLogger(__name__)

Action = Literal[
    "export", "pause", "resume", "promote", "rollback", "retrain", "retrain_stop",
    "experiment_start", "experiment_stop", "experiment_conclude",
]
TRAINER_ACTIONS = ("export", "pause", "resume", "retrain", "retrain_stop")
AUDIT_LOOKBACK = 5_000
"""Newest audit entries searched for an earlier use of an action id."""


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


FINISHED = ("done", "failed", "timeout")
"""Outcome statuses of an action (``requested`` is written before it starts)."""
ACK_POLL_S = 0.05
"""Seconds between reads of the trainers' acknowledgements while actions wait."""


class ActionRunner:
    """Carries out actions without holding a thread while they wait (one per dashboard).

    Why: ``act`` used to be a plain route, so each action waiting up to
    ``ack_timeout_s`` for a trainer held one of the web server's worker
    threads; 41 of them (no trainer running) left none for ``/healthz`` or
    ``POST /v1/events`` for a minute. Here an action is a coroutine: its
    blocking steps (audit append, send, registry) run briefly in threads, and
    every waiting action is resolved by one poller that reads the acks of all
    of them at once (:meth:`ControlChannel.finals`) every :data:`ACK_POLL_S`.

    An action id names one action: the same id with another action, target
    or arguments is refused (:class:`Conflict`, 409), and the same request
    again returns the first one's outcome (waiting for it if it is still
    running), so a page may resend safely. At most ``max_pending`` actions
    wait at once; more are refused (:class:`TooManyRequests`, 429).
    """

    def __init__(
        self,
        service: Service,
        channel: ControlChannel,
        audit: AuditLog,
        timeout_s: float,
        max_pending: int,
    ) -> None:
        self.service = service
        self.channel = channel
        self.audit = audit
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._pending: dict[str, tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = {}
        self._acks: dict[str, asyncio.Future[Ack]] = {}
        self._poller: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self, action: Action, body: ActionRequest, operator: Operator) -> dict[str, Any]:
        """Carry out ``action``; returns the outcome entry written to the audit log."""
        args = _args(body)
        target: str = getattr(body, "target", LIVE)
        what = {"action": action, "target": target, "args": args}
        action_id = body.id or uuid.uuid4().hex
        running = self._pending.get(action_id)
        if running is not None:
            _same_action(action_id, running[0], what)
            return await asyncio.shield(running[1])
        if body.id:
            earlier = await asyncio.to_thread(_entries_of, self.audit, action_id)
            if earlier:
                _same_action(action_id, earlier[0], what)
                return earlier[-1]
            if action_id in self._pending:  # the same id arrived while we read the audit
                return await self.run(action, body, operator)
        if len(self._pending) >= self.max_pending:
            raise TooManyRequests(
                f"{len(self._pending)} actions are already waiting (dashboard.max_pending_actions)",
                retry_after_s=max(1, round(self.timeout_s / 4)),
            )
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[action_id] = (what, done)
        try:
            outcome = await self._execute(action_id, action, args, target, operator)
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        except BaseException:  # cancelled: whoever waits on the same id is cancelled too
            done.cancel()
            raise
        finally:
            self._pending.pop(action_id, None)
        done.set_result(outcome)
        return outcome

    async def _execute(
        self, action_id: str, action: Action, args: dict[str, Any], target: str,
        operator: Operator,
    ) -> dict[str, Any]:
        command = ControlCommand(action, args, operator.label, target, action_id)
        base = {
            "id": action_id, "actor": operator.name, "role": operator.role,
            "address": operator.address, "action": action, "target": target, "args": args,
        }
        requested = {**base, "ts_ms": _now_ms(), "status": "requested", "message": ""}
        await asyncio.to_thread(self.audit.append, requested)
        result: dict[str, Any] = {}
        try:
            if action == "promote":
                status, message, result = await _promote(
                    self.service, str(args["version"]), self.timeout_s
                )
            elif action == "rollback":
                status, message, result = await _rollback(self.service, self.timeout_s)
            elif action.startswith("experiment_"):
                from app.dashboard.experiments import run_experiment_action

                status, message, result = await run_experiment_action(
                    self.service, action, args, operator.label, _promote, self.timeout_s
                )
            else:
                await asyncio.to_thread(self.channel.send, command)
                ack = await self._wait_ack(command.id)
                if ack is None:
                    status = "timeout"
                    message = (
                        f"no trainer acknowledged within {self.timeout_s:g} s (is one running?)"
                    )
                else:
                    status, message, result = ack.status, ack.message, ack.result
                if action == "export" and status == "done":
                    status, message, result = await _export_served(
                        self.service, target, args, result, self.timeout_s
                    )
        except VidrecError as exc:
            status, message = "failed", exc.message
        outcome = {
            **base, "ts_ms": _now_ms(), "status": status, "message": message, "result": result,
        }
        await asyncio.to_thread(self.audit.append, outcome)
        log.info("dashboard: %s %s by %s: %s %s", action, action_id, operator.label, status,
                 message)
        return outcome

    async def _wait_ack(self, command_id: str) -> Ack | None:
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._acks[command_id] = future
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_acks())
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            return None
        finally:
            self._acks.pop(command_id, None)

    async def _poll_acks(self) -> None:
        """Resolve every waiting action's ack from one read per :data:`ACK_POLL_S`."""
        while self._acks:
            try:
                finals = await asyncio.to_thread(self.channel.finals, list(self._acks))
            except VidrecError as exc:  # the channel's store is down: keep waiting
                log.warning("dashboard: reading acknowledgements failed: %s", exc)
                finals = {}
            for command_id, ack in finals.items():
                future = self._acks.get(command_id)
                if future is not None and not future.done():
                    future.set_result(ack)
            await asyncio.sleep(ACK_POLL_S)


def _same_action(action_id: str, first: dict[str, Any], what: dict[str, Any]) -> None:
    """Refuse an id already used for another action, target or arguments."""
    if {k: first.get(k) for k in what} != what:
        raise Conflict(
            f"id: {action_id!r} already names a {first.get('action')} action "
            f"(target {first.get('target')!r}, args {first.get('args')}); use a new id"
        )


def _entries_of(audit: AuditLog, action_id: str) -> list[dict[str, Any]]:
    """The audit entries of one action id, oldest first (its request, then its outcome)."""
    return [e for e in audit.entries(AUDIT_LOOKBACK) if e.get("id") == action_id]


def _args(body: ActionRequest) -> dict[str, Any]:
    """The command's arguments: the body's fields other than ``id`` and ``target``."""
    return body.model_dump(exclude={"id", "target"})


def _served_version(service: Service) -> str | None:
    return service.model.version if service.model is not None else None


async def _await_served(
    service: Service, version: str, timeout_s: float, served_before: str | None
) -> tuple[bool, str | None]:
    """(True, None) once the service serves ``version``, or a newer version of its family
    that replaced it (its family's trainer exported and activated again meanwhile: with
    a short export interval that can happen before the holder's next poll); (False,
    reason) if it refused or never got there.

    ``served_before`` is what the service served when the action began: it never
    counts as a replacement (rolling back from v2 to v1 must not end while v2,
    a later export of v1's family, is still served)."""
    deadline = time.monotonic() + timeout_s
    registry = service.resources.registry
    wanted = await asyncio.to_thread(registry.manifest, version)
    while time.monotonic() < deadline:
        model = service.model
        if model is not None and (
            model.version == version
            or (model.version != served_before and _replaced(model.manifest, wanted))
        ):
            return True, None
        if version in service.holder.failed:
            return False, service.holder.failed[version]
        await asyncio.sleep(0.02)
    return False, f"not served within {timeout_s:g} s"


def _replaced(served: Manifest, wanted: Manifest) -> bool:
    """``served`` is a later export of ``wanted``'s family (what its trainer activates)."""
    return served.family == wanted.family and served.created_at_ms > wanted.created_at_ms


async def _export_served(
    service: Service, target: str, args: dict[str, Any], result: dict[str, Any],
    timeout_s: float,
) -> tuple[str, str, dict[str, Any]]:
    """An export the trainer acknowledged, ended once this service serves it.

    Why: the trainer acknowledges once the version is published and activated,
    but the service loads it at its next registry poll and warms it first; an
    operator (or a script) that exports and then recommends must get the new
    version. A version that is not activated (``activate: false``, or a
    retrain family that is not the active one) is not waited for: the message
    says so and names the version served. One the service refuses is put back
    like a refused promotion (the pointer never stays on a model nobody serves).
    """
    version = str(result.get("version", ""))
    registry = service.resources.registry
    served_before = _served_version(service)
    active = await asyncio.to_thread(registry.active)
    if active != version:
        served = service.model.version if service.model is not None else None
        if target != LIVE:
            why = "a retrain family's export is kept for comparison: promote it to serve it"
        elif not args.get("activate", True):
            why = "activate: false"
        else:
            why = f"the active version is {active}"
        return "done", f"exported {version} (not activated: {why}); serving {served}", {
            **result, "activated": False, "served": served,
        }
    ok, reason = await _await_served(service, version, timeout_s, served_before)
    if ok:
        return "done", f"exported {version} (active and served)", {
            **result, "activated": True, "served": version,
        }
    if reason and version in service.holder.failed:
        if await asyncio.to_thread(registry.active) == version:
            await asyncio.to_thread(registry.rollback)
    served = service.model.version if service.model is not None else None
    return "failed", f"exported {version} (not served: {reason}); serving {served}", {
        **result, "activated": False, "served": served,
    }


async def _promote(
    service: Service, version: str, timeout_s: float
) -> tuple[str, str, dict[str, Any]]:
    registry = service.resources.registry
    before = await asyncio.to_thread(registry.active)
    served_before = _served_version(service)
    await asyncio.to_thread(registry.activate, version)  # NotFound for an unknown version
    served, reason = await _await_served(service, version, timeout_s, served_before)
    if served:
        return "done", f"{version} is active and served", {"version": version, "previous": before}
    if await asyncio.to_thread(registry.active) == version and before is not None:
        await asyncio.to_thread(registry.rollback)  # never leave the pointer on an unserved model
    return "failed", f"{version} refused by the service ({reason}); {before} stays active", {}


async def _rollback(service: Service, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    registry = service.resources.registry
    before = await asyncio.to_thread(registry.active)
    served_before = _served_version(service)
    version = await asyncio.to_thread(registry.rollback)  # Conflict: nothing to go back to
    served, reason = await _await_served(service, version, timeout_s, served_before)
    if served:
        now = service.model.version if service.model is not None else version
        return "done", f"rolled back from {before} to {version}", {
            "version": version, "previous": before, "served": now,
        }
    return "failed", f"{version} is active but not served: {reason}", {"version": version}
