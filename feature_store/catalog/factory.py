"""Opening the catalog store a process was configured for."""

from __future__ import annotations

from pathlib import Path

import redis

from feature_store.catalog.memory import SNAPSHOT_FILE, MemoryCatalog
from feature_store.catalog.redis import RedisCatalog
from feature_store.settings import Settings


def open_catalog(
    settings: Settings,
    redis_client: redis.Redis | None = None,
    data_dir: Path | None = None,
) -> MemoryCatalog | RedisCatalog:
    """The ``redis`` backend when a client is given, else the embedded ``memory`` one.

    ``redis_client`` stays the caller's: the caller opened it (one client per
    process, shared by every store) and closes it after closing the store.
    ``data_dir``: where the memory backend persists (usually
    ``settings.data_dir / "catalog"``); a snapshot found there is restored
    now and :meth:`~MemoryCatalog.close` writes a new one. ``None`` keeps the
    catalog in memory only (tests, throwaway runs). Ignored for Redis, which
    persists itself.
    """
    if redis_client is not None:
        return RedisCatalog(redis_client, chunk=settings.redis.batch_chunk)
    store = MemoryCatalog(snapshot_dir=data_dir)
    if data_dir is not None and (data_dir / SNAPSHOT_FILE).is_file():
        store.restore(data_dir)
    return store
