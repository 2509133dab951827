"""Opening the factor store a process was configured for."""

from __future__ import annotations

from typing import Any

from feature_store.errors import ConfigurationError
from feature_store.factors.memory import MemoryFactors
from feature_store.factors.redis import RedisFactors
from feature_store.settings import Settings


def open_factors(settings: Settings, redis_client: Any = None) -> MemoryFactors | RedisFactors:
    """Redis when ``stores.backend`` is ``redis`` (``redis_client`` stays the caller's),
    else in this process; namespaced by the family (``sparse.model_name``)."""
    if settings.stores.backend == "redis":
        if redis_client is None:
            raise ConfigurationError("stores.backend is 'redis' but no Redis client was given")
        return RedisFactors(redis_client, settings.sparse.model_name)
    return MemoryFactors()
