"""The one translation of Redis and Redis Cluster failures into vidrec's errors.

redis-py fails in three families that share no base class:

- :class:`redis.RedisError` (connection refused, timeouts, error replies,
  :class:`~feature_store.runtime.breaker.CircuitOpen`),
- :class:`redis.exceptions.RedisClusterException` (no node answers, the slot
  map cannot be built; not a ``RedisError``),
- :class:`OSError` from a socket that redis-py did not wrap.

Every backend catches :data:`REDIS_FAILURES` at its boundary, through
:func:`redis_errors`, and raises the :class:`~feature_store.errors.BackendUnavailable`
subclass its callers expect (``SparseTableUnavailable``, ``StoreUnavailable``)
``from`` the original. Catching one family and not another is how a trainer
used to die on a ``RedisClusterException``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import RedisClusterException

from feature_store.errors import BackendUnavailable

REDIS_FAILURES: tuple[type[BaseException], ...] = (
    redis.RedisError,
    RedisClusterException,
    OSError,
)
"""What a call into redis-py may raise when Redis, a node or the network fails."""


@contextmanager
def redis_errors(error: type[BackendUnavailable], what: str) -> Iterator[None]:
    """Raise ``error("{what}: {cause}")`` from any of :data:`REDIS_FAILURES` in the block.

    ``what`` names the store and operation (``"sparse table 'user_id'"``,
    ``"catalog get_many failed"``) so the message says what was being done.
    """
    try:
        yield
    except REDIS_FAILURES as exc:
        raise error(f"{what}: {exc}") from exc
