"""Opening the catalog backend a process was configured for."""

from __future__ import annotations

from pathlib import Path

import redis

from feature_store.catalog.memory import MemoryCatalog
from feature_store.catalog.redis import RedisCatalog
from feature_store.errors import ConfigurationError
from feature_store.settings import Settings


def open_catalog(
    settings: Settings,
    redis_client: redis.Redis | None = None,
    data_dir: Path | None = None,
) -> MemoryCatalog | RedisCatalog:
    """The backend named by ``settings.stores.backend``.

    ``redis_client`` (required for ``redis``) stays the caller's: one client
    per process is shared by every store, and whoever opened it closes it
    after closing the store. ``data_dir`` is where the embedded catalog's
    snapshots live; the owner (:class:`feature_store.runtime.resources.Resources`)
    snapshots and restores it there (opening reads nothing from disk), and
    the catalog journals each write there (fsynced before it is answered).
    """
    if settings.stores.backend == "redis":
        if redis_client is None:
            raise ConfigurationError("stores.backend is 'redis' but no Redis client was given")
        return RedisCatalog(redis_client, chunk=settings.redis.batch_chunk)
    return MemoryCatalog(journal_dir=data_dir)
