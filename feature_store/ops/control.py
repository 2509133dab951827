"""The control channel: operator commands to trainers, and their acknowledgements.

The dashboard (in the API process) sends a :class:`Command` (an id, who
issued it, an action, its arguments and the trainer it targets); a
listener running beside each trainer (``trainer.control.ControlListener``)
reads it, acknowledges it as ``accepted``, carries it out and acknowledges
it again as ``done`` or ``failed`` with a message and a result. The issuer
waits for the final :class:`Ack` (:meth:`ControlChannel.wait`) and shows it.

The channel is part of the contract between the two sides (the API sends,
the trainer listens, possibly on different machines), so it lives here;
the listener, which carries commands out on a trainer, lives in ``trainer``.

Backends, chosen like the metrics series (``stores.backend``):

- ``memory``: in-process lists under a condition variable; the embedded
  mode (``vidrec up``), where the API and the trainer share one process.
- ``redis``: two capped streams (``constants.CONTROL_COMMANDS`` and
  ``CONTROL_ACKS``); the listener reads commands with ``XREAD BLOCK``, so
  ``vidrec serve`` and ``vidrec train`` on separate machines talk through
  the Redis they already share.

Delivery: a listener reads commands issued *after* it started (a trainer
that was down does not replay old pauses and exports on its return); a
command nobody acknowledges times out at the issuer, who says so. Every
listener whose ``target`` matches acts: with several replicas of one
trainer group each pauses, and each exports (the first final ack answers
the issuer).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import redis

from feature_store.constants import CONTROL_ACKS, CONTROL_COMMANDS
from feature_store.errors import StoreUnavailable
from feature_store.redis_errors import redis_errors

if TYPE_CHECKING:
    from feature_store.settings import Settings

log = logging.getLogger(__name__)

LIVE = "live"
"""Target of the live trainer (its family serves); retrain families have their own ids."""
ACTIONS = ("pause", "resume", "export", "status", "retrain", "retrain_stop")
"""Actions a listener knows; anything else is acknowledged as ``failed``."""
_STREAM_LEN = 10_000
"""Entries kept by each Redis stream (approximate MAXLEN)."""

AckStatus = Literal["accepted", "done", "failed"]
FINAL: tuple[AckStatus, ...] = ("done", "failed")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Command:
    """One operator request to the trainer(s) named by ``target``."""

    action: str
    args: dict[str, Any] = field(default_factory=dict)
    issuer: str = "unknown"
    """Who asked (the dashboard's operator name and role)."""
    target: str = LIVE
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    issued_at_ms: int = field(default_factory=_now_ms)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: str | bytes) -> Command:
        raw = json.loads(data)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@dataclass(frozen=True)
class Ack:
    """A listener's answer to one command: ``accepted``, then ``done`` or ``failed``."""

    command_id: str
    status: AckStatus
    message: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    by: str = ""
    """The trainer that answered (its consumer group)."""
    ts_ms: int = field(default_factory=_now_ms)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, data: str | bytes) -> Ack:
        raw = json.loads(data)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@runtime_checkable
class ControlChannel(Protocol):
    """Commands one way, acknowledgements back. Backends: memory, redis."""

    def send(self, command: Command) -> str:
        """Publish ``command``; returns its id."""
        ...

    def tail(self) -> str:
        """A cursor at the current end: :meth:`commands` after it returns only newer ones."""
        ...

    def commands(self, after: str, timeout_s: float) -> list[tuple[str, Command]]:
        """Commands after cursor ``after`` (waiting at most ``timeout_s``), with their cursors."""
        ...

    def ack(self, ack: Ack) -> None: ...

    def acks(self, command_id: str) -> list[Ack]:
        """Acknowledgements of one command so far, oldest first."""
        ...

    def wait(self, command_id: str, timeout_s: float) -> Ack | None:
        """The first final ack of ``command_id``, or None after ``timeout_s``."""
        ...

    def finals(self, command_ids: Collection[str]) -> dict[str, Ack]:
        """The first final ack of each of ``command_ids`` that has one (one read for all)."""
        ...

    def close(self) -> None: ...


class MemoryChannel:
    """In-process channel for the embedded mode; keeps the last ``capacity`` commands."""

    def __init__(self, capacity: int = 1000) -> None:
        self._commands: deque[tuple[int, Command]] = deque(maxlen=capacity)
        self._acks: dict[str, list[Ack]] = {}
        self._order: deque[str] = deque()
        self._capacity = capacity
        self._seq = 0
        self._cond = threading.Condition()

    def send(self, command: Command) -> str:
        with self._cond:
            self._seq += 1
            self._commands.append((self._seq, command))
            self._cond.notify_all()
        return command.id

    def tail(self) -> str:
        with self._cond:
            return str(self._seq)

    def commands(self, after: str, timeout_s: float) -> list[tuple[str, Command]]:
        start = int(after)
        with self._cond:
            self._cond.wait_for(lambda: self._seq > start, timeout=timeout_s)
            return [(str(seq), cmd) for seq, cmd in self._commands if seq > start]

    def ack(self, ack: Ack) -> None:
        with self._cond:
            if ack.command_id not in self._acks:
                self._order.append(ack.command_id)
                if len(self._order) > self._capacity:
                    self._acks.pop(self._order.popleft(), None)
            self._acks.setdefault(ack.command_id, []).append(ack)
            self._cond.notify_all()

    def acks(self, command_id: str) -> list[Ack]:
        with self._cond:
            return list(self._acks.get(command_id, ()))

    def wait(self, command_id: str, timeout_s: float) -> Ack | None:
        def final() -> Ack | None:
            return next((a for a in self._acks.get(command_id, ()) if a.final), None)

        with self._cond:
            self._cond.wait_for(lambda: final() is not None, timeout=timeout_s)
            return final()

    def finals(self, command_ids: Collection[str]) -> dict[str, Ack]:
        found: dict[str, Ack] = {}
        with self._cond:
            for command_id in command_ids:
                ack = next((a for a in self._acks.get(command_id, ()) if a.final), None)
                if ack is not None:
                    found[command_id] = ack
        return found

    def close(self) -> None:
        pass


class RedisChannel:
    """Two capped Redis streams; see the module docstring."""

    def __init__(self, client: redis.Redis, block_s: float = 0.5) -> None:
        self.client = client
        self.block_s = block_s
        """Longest single ``XREAD BLOCK``; below the client's socket timeout."""

    def send(self, command: Command) -> str:
        self._call(
            "send", lambda: self.client.xadd(
                CONTROL_COMMANDS, {"c": command.to_json()}, maxlen=_STREAM_LEN, approximate=True
            )
        )
        return command.id

    def tail(self) -> str:
        entries = self._call("tail", lambda: self.client.xrevrange(CONTROL_COMMANDS, count=1))
        return _text(entries[0][0]) if entries else "0-0"

    def commands(self, after: str, timeout_s: float) -> list[tuple[str, Command]]:
        block_ms = max(1, int(min(timeout_s, self.block_s) * 1000))
        reply = self._call(
            "read", lambda: self.client.xread({CONTROL_COMMANDS: after}, count=100, block=block_ms)
        )
        out: list[tuple[str, Command]] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                try:
                    out.append((_text(entry_id), Command.from_json(fields[b"c"])))
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("control: unreadable command %s skipped: %s", entry_id, exc)
        return out

    def ack(self, ack: Ack) -> None:
        self._call(
            "ack", lambda: self.client.xadd(
                CONTROL_ACKS, {"id": ack.command_id, "a": ack.to_json()},
                maxlen=_STREAM_LEN, approximate=True,
            )
        )

    def acks(self, command_id: str) -> list[Ack]:
        # Operator commands are rare: the newest thousand acks hold any command in flight.
        entries = self._call("acks", lambda: self.client.xrevrange(CONTROL_ACKS, count=1000))
        found = [
            Ack.from_json(fields[b"a"]) for _, fields in entries
            if fields.get(b"id", b"").decode() == command_id
        ]
        return found[::-1]

    def wait(self, command_id: str, timeout_s: float) -> Ack | None:
        deadline = time.monotonic() + timeout_s
        while True:
            final = next((a for a in self.acks(command_id) if a.final), None)
            if final is not None or time.monotonic() >= deadline:
                return final
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def finals(self, command_ids: Collection[str]) -> dict[str, Ack]:
        wanted = set(command_ids)
        entries = self._call("acks", lambda: self.client.xrevrange(CONTROL_ACKS, count=1000))
        found: dict[str, Ack] = {}
        for _, fields in reversed(entries):  # oldest first: the first final ack wins
            command_id = fields.get(b"id", b"").decode()
            if command_id in wanted and command_id not in found:
                ack = Ack.from_json(fields[b"a"])
                if ack.final:
                    found[command_id] = ack
        return found

    def close(self) -> None:
        pass  # the client belongs to whoever opened it

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        with redis_errors(StoreUnavailable, f"control channel {what} failed"):
            return fn()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_control(settings: Settings, redis_client: redis.Redis | None = None) -> ControlChannel:
    """The channel ``settings.stores.backend`` picks; the caller closes it.

    Opened once per process by :func:`feature_store.runtime.resources.open_resources`:
    embedded, the API and the trainer get the same in-process object; with
    ``stores.backend = "redis"`` every process talks through Redis.
    """
    if settings.stores.backend == "redis" and redis_client is not None:
        return RedisChannel(redis_client)
    return MemoryChannel()
