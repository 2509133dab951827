"""The dashboard's audit log: who did what, when, and how it ended.

Every action writes a ``requested`` entry before it starts and an outcome
entry (``done``, ``failed``, ``timeout``) when it ends, both carrying the
action's id; :meth:`AuditLog.recent` folds them into one row per action
(newest first), so the page shows an action in progress and then its
result. Entries are flat JSON objects::

    {"id", "ts_ms", "actor", "role", "action", "args", "status", "message", "result"}

Backends, chosen like the other stores (``stores.backend``):

- ``memory``: appended to ``<data_dir>/dashboard/audit.jsonl`` (fsynced, so
  a crash loses at most a torn last line, which is skipped on read);
- ``redis``: a capped stream (``constants.DASHBOARD_AUDIT``), shared by every
  API replica.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import redis

from feature_store.constants import DASHBOARD_AUDIT
from feature_store.errors import StoreUnavailable
from feature_store.redis_errors import redis_errors

if TYPE_CHECKING:
    from feature_store.runtime.resources import Resources

Entry = dict[str, Any]

_REDIS_LEN = 100_000
"""Entries kept by the Redis stream (approximate MAXLEN)."""
_READ_BACK = 5_000
"""Lines (or stream entries) read back to fold the most recent actions."""


class AuditLog(Protocol):
    def append(self, entry: Entry) -> None:
        """Persist one entry; raises :class:`StoreUnavailable` when it cannot."""
        ...

    def entries(self, limit: int) -> list[Entry]:
        """The newest ``limit`` raw entries, oldest first."""
        ...


class FileAuditLog:
    """JSON lines under the data directory; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, entry: Entry) -> None:
        line = json.dumps(entry, default=str) + "\n"
        with self._lock:
            try:
                with open(self.path, "a") as fh:
                    fh.write(line)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                raise StoreUnavailable(f"audit log {self.path}: {exc}") from exc

    def entries(self, limit: int) -> list[Entry]:
        out: deque[Entry] = deque(maxlen=limit)
        with self._lock:
            try:
                with open(self.path) as fh:
                    for line in fh:
                        try:
                            out.append(json.loads(line))
                        except json.JSONDecodeError:
                            continue  # a line torn by a crash mid-append
            except FileNotFoundError:
                pass
        return list(out)


class RedisAuditLog:
    """A capped Redis stream; see the module docstring."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def append(self, entry: Entry) -> None:
        with redis_errors(StoreUnavailable, "audit log append failed"):
            self.client.xadd(
                DASHBOARD_AUDIT, {"e": json.dumps(entry, default=str)},
                maxlen=_REDIS_LEN, approximate=True,
            )

    def entries(self, limit: int) -> list[Entry]:
        with redis_errors(StoreUnavailable, "audit log read failed"):
            raw: Any = self.client.xrevrange(DASHBOARD_AUDIT, count=limit)
        return [json.loads(fields[b"e"]) for _, fields in reversed(list(raw or []))]


def open_audit_log(resources: Resources) -> AuditLog:
    if resources.settings.stores.backend == "redis" and resources.redis_client is not None:
        return RedisAuditLog(resources.redis_client)
    return FileAuditLog(resources.data_dir / "dashboard" / "audit.jsonl")


def recent(log: AuditLog, limit: int) -> list[Entry]:
    """One row per action, newest first: its request merged with its latest outcome."""
    rows: dict[str, Entry] = {}
    for entry in log.entries(_READ_BACK):
        key = str(entry.get("id"))
        if key in rows:
            first = rows[key]
            rows[key] = {**first, **entry, "ts_ms": first["ts_ms"], "ended_ms": entry["ts_ms"]}
        else:
            rows[key] = dict(entry)
    return list(reversed(list(rows.values())))[:limit]
