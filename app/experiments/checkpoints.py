"""Where the experiment feed keeps each partition's checkpoint (offset, log time, totals).

One JSON object per event-log partition (:meth:`PartitionTally.state
<app.experiments.tally.PartitionTally.state>`), written whole, so the totals
and the position they cover always change together. Chosen like the other
stores (``stores.backend``):

- ``memory`` (embedded, one process): a dict, mirrored to
  ``<data_dir>/experiments/feed.json`` (replaced atomically) so a restart
  resumes where the last save was;
- ``redis``: the hash ``constants.EXPERIMENT_FEED``, field = partition. Every
  serving process reads all of it, so each dashboard shows the totals of
  every partition whichever replica's feed counted them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

import redis

from feature_store.atomic import atomic_text
from feature_store.constants import EXPERIMENT_FEED
from feature_store.errors import StoreUnavailable
from feature_store.redis_errors import redis_errors
from feature_store.runtime.resources import Resources

State = dict[str, Any]


class FeedCheckpoints(Protocol):
    def load(self) -> dict[int, State]:
        """Every partition's last saved state."""
        ...

    def save(self, states: dict[int, State]) -> None:
        """Replace these partitions' states (each one whole)."""
        ...


class MemoryCheckpoints:
    """In-process, mirrored to a JSON file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._states: dict[int, State] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self._states = {int(p): s for p, s in data.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            raise StoreUnavailable(f"experiment feed checkpoints {path}: {exc}") from exc

    def load(self) -> dict[int, State]:
        with self._lock:
            return dict(self._states)

    def save(self, states: dict[int, State]) -> None:
        with self._lock:
            self._states.update(states)
            data = {str(p): s for p, s in sorted(self._states.items())}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_text(self.path) as out:
                    json.dump(data, out)
            except OSError as exc:
                raise StoreUnavailable(f"experiment feed checkpoints {self.path}: {exc}") from exc


class RedisCheckpoints:
    """A Redis hash shared by every serving process (see the module docstring)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def load(self) -> dict[int, State]:
        with redis_errors(StoreUnavailable, "experiment feed checkpoints"):
            raw: Any = self.client.hgetall(EXPERIMENT_FEED)
        return {int(p): json.loads(s) for p, s in (raw or {}).items()}

    def save(self, states: dict[int, State]) -> None:
        if not states:
            return
        with redis_errors(StoreUnavailable, "experiment feed checkpoints"):
            self.client.hset(
                EXPERIMENT_FEED, mapping={str(p): json.dumps(s) for p, s in states.items()}
            )


def open_checkpoints(resources: Resources) -> FeedCheckpoints:
    if resources.settings.stores.backend == "redis" and resources.redis_client is not None:
        return RedisCheckpoints(resources.redis_client)
    return MemoryCheckpoints(resources.data_dir / "experiments" / "feed.json")
