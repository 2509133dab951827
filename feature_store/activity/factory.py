"""Opening the activity backend a process was configured for."""

from __future__ import annotations

from pathlib import Path

import redis

from feature_store.activity.memory import MemoryActivity
from feature_store.activity.redis import RedisActivity
from feature_store.constants import TRAINING_HISTORY, TRAINING_VIDEO_STATS
from feature_store.errors import ConfigurationError
from feature_store.settings import Settings


def open_activity(
    settings: Settings,
    redis_client: redis.Redis | None = None,
    data_dir: Path | None = None,
    *,
    training: bool = False,
) -> MemoryActivity | RedisActivity:
    """The backend named by ``settings.stores.backend``; ``training``: the trainer's own
    copy (its own Redis keys), else serving's.

    ``redis_client`` (required for ``redis``) stays the caller's, who closes
    it after closing the store. ``data_dir`` is where the embedded store's
    snapshots live; the owner (:class:`feature_store.runtime.resources.Resources`)
    snapshots and restores it there, so opening reads nothing from disk and
    the parameter only keeps the factories' signatures alike.
    """
    del data_dir  # see the docstring: persistence is the owner's call
    if settings.stores.backend == "redis":
        if redis_client is None:
            raise ConfigurationError("stores.backend is 'redis' but no Redis client was given")
        if training:
            return RedisActivity(
                redis_client, settings.features, chunk=settings.redis.batch_chunk,
                history_prefix=TRAINING_HISTORY, stats_prefix=TRAINING_VIDEO_STATS,
            )
        return RedisActivity(redis_client, settings.features, chunk=settings.redis.batch_chunk)
    return MemoryActivity(settings.features)
