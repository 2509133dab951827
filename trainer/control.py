"""The control listener: carries out the dashboard's commands on a trainer.

It reads :class:`~feature_store.ops.control.Command` s for its ``target`` from the
process's :class:`~feature_store.ops.control.ControlChannel`, acknowledges each
as ``accepted``, carries it out through the
:class:`TrainerHandle` protocol and acknowledges it
again as ``done`` or ``failed``. Retraining (a second model family) is
handled by an optional :class:`Retrainer` (``trainer.retrain``). The
composition root starts one beside every trainer, embedded (``vidrec up``)
or alone (``vidrec train``).
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from feature_store.errors import InvalidInput, StoreUnavailable
from feature_store.ops.control import ACTIONS, LIVE, Ack, Command, ControlChannel
from feature_store.runtime.worker import Worker

log = logging.getLogger(__name__)


@runtime_checkable
class TrainerHandle(Protocol):
    """What the listener and the retrain manager drive: a running (or runnable) trainer.

    :class:`trainer.component.TrainerComponent` is the one the composition
    root builds; tests drive the listener with fakes.
    """

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


class Retrainer(Protocol):
    """What a listener needs to start, stop and steer retrain families."""

    def handle(self, command: Command) -> tuple[str, dict[str, Any]]:
        """Carry out ``retrain``/``retrain_stop`` or a command targeting a family."""
        ...

    def targets(self) -> set[str]:
        """Ids of the retrain families this process runs."""
        ...

    def close(self) -> None: ...


class ControlListener:
    """Reads commands for ``target`` and carries them out on ``trainer``; acks each.

    Runs in its own daemon thread from :meth:`start` (or ``with``) until
    :meth:`close`. Commands are handled one at a time, in the order issued.
    """

    def __init__(
        self,
        channel: ControlChannel,
        trainer: TrainerHandle,
        *,
        target: str = LIVE,
        retrainer: Retrainer | None = None,
        poll_s: float = 0.5,
        state_wait_s: float = 10.0,
    ) -> None:
        self.channel = channel
        self.trainer = trainer
        self.target = target
        self.retrainer = retrainer
        self.poll_s = poll_s
        self.state_wait_s = state_wait_s
        """How long pause/resume wait for the loop to report the new state."""
        self.handled = 0
        self._cursor = ""
        self._name = _group_of(trainer)
        self._worker = Worker("vidrec-control", lambda stop: self._loop(), join_timeout_s=30)
        self._stop = self._worker.stop_event

    def start(self) -> ControlListener:
        self._cursor = self.channel.tail()
        self._worker.start()
        log.info("control listener for %s (%s) started", self.target, self._name)
        return self

    def close(self) -> None:
        self._worker.stop()
        if self.retrainer is not None:
            self.retrainer.close()

    def __enter__(self) -> ControlListener:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.channel.commands(self._cursor, self.poll_s)
            except StoreUnavailable as exc:
                log.warning("control channel unavailable: %s", exc)
                self._stop.wait(1.0)
                continue
            for cursor, command in batch:
                self._cursor = cursor
                if self._mine(command) and not self._exported_by_another(command):
                    self.handle(command)

    def _exported_by_another(self, command: Command) -> bool:
        """An export of the live trainer is the group's exporter's to answer
        (``trainer/distributed.py``); the other members stay silent."""
        if command.action != "export" or command.target != self.target:
            return False
        try:
            return self.trainer.status().get("exporter") is False
        except Exception:  # a status that fails to read: answer (and fail) rather than hide
            return False

    def _mine(self, command: Command) -> bool:
        if command.target == self.target:
            return True
        return self.retrainer is not None and command.target in self.retrainer.targets()

    def handle(self, command: Command) -> Ack:
        """Acknowledge, carry out and acknowledge again; returns the final ack."""
        self._ack(Ack(command.id, "accepted", f"{command.action} accepted", by=self._name))
        try:
            message, result = self._dispatch(command)
            final = Ack(command.id, "done", message, result, by=self._name)
        except Exception as exc:  # the issuer sees the reason; the listener goes on
            log.warning("control: %s %s failed: %s", command.action, command.id, exc)
            final = Ack(command.id, "failed", f"{type(exc).__name__}: {exc}", by=self._name)
        self._ack(final)
        self.handled += 1
        return final

    def _ack(self, ack: Ack) -> None:
        try:
            self.channel.ack(ack)
        except StoreUnavailable as exc:
            log.warning("control: ack of %s lost: %s", ack.command_id, exc)

    def _dispatch(self, command: Command) -> tuple[str, dict[str, Any]]:
        action = command.action
        if self.retrainer is not None and (
            action in ("retrain", "retrain_stop") or command.target != self.target
        ):
            return self.retrainer.handle(command)
        trainer = self.trainer
        if action == "pause":
            trainer.pause()
            state = self._await_state("paused")
            return f"trainer {state}", {"state": state}
        if action == "resume":
            trainer.resume()
            state = self._await_state("running")
            return f"trainer {state}", {"state": state}
        if action == "export":
            version = trainer.export_now(activate=bool(command.args.get("activate", True)))
            return f"exported {version}", {"version": version}
        if action == "status":
            return "status", {"status": trainer.status()}
        if action in ("retrain", "retrain_stop"):
            raise InvalidInput("action", "this trainer process runs no retrain manager")
        raise InvalidInput("action", f"unknown action {action!r}; known: {', '.join(ACTIONS)}")

    def _await_state(self, wanted: str) -> str:
        """The trainer's state once it reports ``wanted`` (or whatever it is at the deadline)."""
        deadline = time.monotonic() + self.state_wait_s
        state = str(self.trainer.status().get("state"))
        while state != wanted and time.monotonic() < deadline:
            time.sleep(0.02)
            state = str(self.trainer.status().get("state"))
        return state


def _group_of(trainer: TrainerHandle) -> str:
    try:
        return str(trainer.status().get("group_id", "trainer"))
    except Exception:  # a name for logs only
        return "trainer"
