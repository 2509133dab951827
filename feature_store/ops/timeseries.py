"""The trainer's metrics as a time series, plus its status heartbeat.

The trainer appends one point (a flat JSON object: AUC, logloss, events/s,
lag...) every ``trainer.metrics_every_s``; the service and the dashboard read
them back to draw curves, and read the heartbeat to tell a live trainer from
a dead one (a process without a port proves it is alive by refreshing a key
with a TTL).

Backends, chosen like the stores (``stores.backend``):

- ``memory``: a ring of the last ``capacity`` points, mirrored to a JSONL file
  in the data directory (so a restart, or another process on the same
  volume, sees the history); the heartbeat is a JSON file replaced
  atomically, with its expiry time inside.
- ``redis``: a capped stream (``XADD ... MAXLEN ~ capacity``) and a ``SET``
  with ``PX``; any process on the same Redis reads them.

Every point carries ``ts_ms`` (wall clock, ms since epoch). NaN values
(e.g. AUC before both classes were seen) are stored as ``null``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import redis

from feature_store.atomic import atomic_write
from feature_store.constants import TRAINER_METRICS, TRAINER_STATUS
from feature_store.errors import StoreUnavailable
from feature_store.redis_errors import redis_errors

if TYPE_CHECKING:
    from feature_store.settings import Settings

Point = dict[str, Any]


def _clean(point: Point) -> Point:
    out: Point = {}
    for key, value in point.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    out.setdefault("ts_ms", int(time.time() * 1000))
    return out


@runtime_checkable
class MetricsSeries(Protocol):
    """Append-only metric points and a heartbeat. Backends: memory, redis."""

    def append(self, point: Point) -> None:
        """Add one point (``ts_ms`` is set to now when absent)."""
        ...

    def read(self, since_ms: int = 0, limit: int = 1000) -> list[Point]:
        """Points with ``ts_ms > since_ms``, oldest first, at most ``limit``."""
        ...

    def latest(self) -> Point | None: ...

    def heartbeat(self, status: Point, ttl_s: float) -> None:
        """Publish the writer's status; it counts as gone ``ttl_s`` after."""
        ...

    def status(self) -> Point | None:
        """The last heartbeat, or None if there is none or it expired."""
        ...

    def close(self) -> None: ...


class MemorySeries:
    """Ring of points mirrored to ``<directory>/metrics.jsonl``; see the module doc."""

    def __init__(self, directory: Path | None, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.directory = Path(directory) if directory is not None else None
        self._points: deque[Point] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._lines = 0
        self._status: Point | None = None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._load()

    @property
    def _file(self) -> Path:
        assert self.directory is not None
        return self.directory / "metrics.jsonl"

    @property
    def _status_file(self) -> Path:
        assert self.directory is not None
        return self.directory / "status.json"

    def _load(self) -> None:
        try:
            with open(self._file) as fh:
                for line in fh:
                    self._lines += 1
                    try:
                        self._points.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line torn by a crash mid-append
        except FileNotFoundError:
            pass

    def append(self, point: Point) -> None:
        point = _clean(point)
        with self._lock:
            self._points.append(point)
            if self.directory is None:
                return
            with open(self._file, "a") as fh:
                fh.write(json.dumps(point) + "\n")
            self._lines += 1
            if self._lines > 2 * self.capacity:  # rewrite to the ring's contents
                atomic_write(self._file, "".join(json.dumps(p) + "\n" for p in self._points))
                self._lines = len(self._points)

    def read(self, since_ms: int = 0, limit: int = 1000) -> list[Point]:
        with self._lock:
            points = [p for p in self._points if p.get("ts_ms", 0) > since_ms]
        return points[:limit]

    def latest(self) -> Point | None:
        with self._lock:
            return self._points[-1] if self._points else None

    def heartbeat(self, status: Point, ttl_s: float) -> None:
        now = int(time.time() * 1000)
        record = {**_clean(status), "expires_at_ms": now + int(ttl_s * 1000)}
        self._status = record
        if self.directory is not None:
            atomic_write(self._status_file, json.dumps(record))

    def status(self) -> Point | None:
        record = self._status
        if record is None and self.directory is not None:
            try:
                record = json.loads(self._status_file.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return None
        if record is None or record.get("expires_at_ms", 0) < time.time() * 1000:
            return None
        return record

    def close(self) -> None:
        pass


class RedisSeries:
    """Capped Redis stream plus a TTL'd status key; see the module doc."""

    def __init__(self, client: redis.Redis, name: str, capacity: int = 10_000) -> None:
        self.client = client
        self.capacity = capacity
        self.key = f"{TRAINER_METRICS}{name}"
        self.status_key = f"{TRAINER_STATUS}{name}"

    def append(self, point: Point) -> None:
        data = json.dumps(_clean(point))
        with redis_errors(StoreUnavailable, "metrics append failed"):
            self.client.xadd(self.key, {"p": data}, maxlen=self.capacity, approximate=True)

    def read(self, since_ms: int = 0, limit: int = 1000) -> list[Point]:
        with redis_errors(StoreUnavailable, "metrics read failed"):
            entries: Any = self.client.xrange(
                self.key, min=f"{since_ms + 1}", max="+", count=limit
            )
        return [_payload(fields) for _, fields in entries]

    def latest(self) -> Point | None:
        with redis_errors(StoreUnavailable, "metrics read failed"):
            entries: Any = self.client.xrevrange(self.key, count=1)
        return _payload(entries[0][1]) if entries else None

    def heartbeat(self, status: Point, ttl_s: float) -> None:
        with redis_errors(StoreUnavailable, "heartbeat failed"):
            self.client.set(self.status_key, json.dumps(_clean(status)), px=int(ttl_s * 1000))

    def status(self) -> Point | None:
        with redis_errors(StoreUnavailable, "status read failed"):
            data = self.client.get(self.status_key)
        return json.loads(data) if data else None

    def close(self) -> None:
        pass  # the client belongs to whoever opened it


def _payload(fields: Any) -> Point:
    """The point in a stream entry, whether the client decodes responses or not."""
    data = fields.get(b"p", fields.get("p"))
    return dict(json.loads(data))


def open_timeseries(
    settings: Settings,
    redis_client: redis.Redis | None = None,
    data_dir: Path | None = None,
    name: str | None = None,
) -> MetricsSeries:
    """The series of trainer ``name`` (default: its group id) per ``stores.backend``."""
    name = name or settings.trainer.group_id
    capacity = settings.trainer.timeseries_points
    if settings.stores.backend == "redis":
        if redis_client is None:
            raise ValueError("the redis metrics series needs a redis client")
        return RedisSeries(redis_client, name, capacity)
    directory = (data_dir or settings.data_dir) / "timeseries" / name
    return MemorySeries(directory, capacity)
