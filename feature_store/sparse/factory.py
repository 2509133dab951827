"""Open sparse tables from the settings tree; a container for a model's tables.

``settings.sparse.backend`` picks the backend. For Redis, pass the client
the process already owns (the app's lifespan opens one and closes it); if
none is given, ``open_table`` connects one itself and the table closes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from feature_store.errors import ConfigurationError, SparseTableUnavailable
from feature_store.redis_errors import redis_errors
from feature_store.runtime.breaker import Breaker, BreakerBackoff, BreakerConnection, redis_probe
from feature_store.settings import RedisSettings, Settings
from feature_store.sparse.base import SparseTable, TableSpec
from feature_store.sparse.cluster import ClusterSparseTable
from feature_store.sparse.memory import MemorySparseTable
from feature_store.sparse.redis import RedisSparseTable


def connect_redis(settings: RedisSettings) -> redis.Redis:
    """A redis-py client for the sparse tables (binary replies); the caller closes it.

    Connecting is lazy: an unreachable server surfaces as
    ``SparseTableUnavailable`` on the first pull or push. Connecting is
    retried twice with a short backoff (redis-py 8's default, 10 retries,
    stalls a batch for seconds); pulls and pushes themselves are never
    retried by the client, since replaying a push would apply its gradients
    twice; the trainer decides what to do with a failed batch.

    With ``settings.cluster`` the URL is a seed node and the client is a
    :class:`redis.cluster.RedisCluster` (it discovers the other nodes and
    the slot map on creation, so an unreachable seed fails here); the
    sparse tables then use :class:`~feature_store.sparse.cluster.ClusterSparseTable`.

    The pool *blocks* when all ``settings.max_connections`` are out: a caller
    waits for one (up to ``socket_timeout_s``, then the backend is unavailable)
    instead of failing at once with redis-py's "Too many connections". One
    process shares the client among the request threads, the embedded trainer
    and the feeds, and a request's reads each hold a connection for one round
    (:mod:`feature_store.sparse.steps`: 14 for one recommend of the default
    schema); the demo on Kafka + Redis hit the old non-blocking pool's limit a
    few times a run.
    """
    if settings.cluster:
        return connect_cluster(settings)  # type: ignore[return-value]
    breaker = Breaker("redis")
    pool = redis.BlockingConnectionPool.from_url(
        settings.url,
        timeout=settings.socket_timeout_s,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.socket_timeout_s,
        max_connections=settings.max_connections,
        decode_responses=False,
        retry=Retry(BreakerBackoff(ExponentialBackoff(cap=0.5, base=0.05), breaker), 2),
        connection_class=BreakerConnection,
        breaker=breaker,
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # closing the client closes its pool
    breaker.probe = redis_probe(pool.connection_kwargs)
    return client


def connect_cluster(settings: RedisSettings) -> RedisCluster:
    """A :class:`RedisCluster` client from a seed node's URL (binary replies)."""
    with redis_errors(SparseTableUnavailable, f"Redis Cluster at {settings.url}"):
        return RedisCluster.from_url(
            settings.url,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            max_connections=settings.max_connections,
            decode_responses=False,
        )


def open_table(
    spec: TableSpec, settings: Settings, redis_client: redis.Redis | None = None
) -> SparseTable:
    """The table ``spec`` on the backend ``settings.sparse.backend`` names.

    With the Redis backend and no ``redis_client``, the table connects from
    ``settings.redis`` and owns (closes) that client.
    """
    if settings.sparse.backend == "memory":
        return MemorySparseTable(spec, settings.sparse)
    if settings.sparse.backend == "redis":
        owns = redis_client is None
        client = connect_redis(settings.redis) if redis_client is None else redis_client
        if isinstance(client, RedisCluster):
            return ClusterSparseTable(
                spec,
                settings.sparse,
                client,
                chunk=settings.redis.batch_chunk,
                owns_client=owns,
            )
        return RedisSparseTable(
            spec,
            settings.sparse,
            client,
            chunk=settings.redis.batch_chunk,
            owns_client=owns,
        )
    raise ConfigurationError(f"sparse.backend: unknown backend {settings.sparse.backend!r}")


class SparseTables(Mapping[str, SparseTable]):
    """A model's sparse tables by name, opened and closed together.

    Snapshots go one directory per table under a parent directory
    (``<dir>/<table name>/``), each written atomically on its own; a crash
    between two tables leaves some tables with the new snapshot and some
    with the previous one, which is fine because rows of different tables
    are independent.
    """

    def __init__(self, tables: Iterable[SparseTable]) -> None:
        self._tables: dict[str, SparseTable] = {}
        for table in tables:
            if table.spec.name in self._tables:
                raise ConfigurationError(f"two sparse tables named {table.spec.name!r}")
            self._tables[table.spec.name] = table

    @classmethod
    def open(
        cls,
        specs: Iterable[TableSpec],
        settings: Settings,
        redis_client: redis.Redis | None = None,
    ) -> SparseTables:
        """Open every table of ``specs``; with Redis and no client, one shared client is
        connected and closed with the container."""
        owned: redis.Redis | None = None
        if settings.sparse.backend == "redis" and redis_client is None:
            owned = redis_client = connect_redis(settings.redis)
        tables = cls([open_table(spec, settings, redis_client) for spec in specs])
        tables._owned_client = owned
        return tables

    _owned_client: redis.Redis | None = None

    def __getitem__(self, name: str) -> SparseTable:
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def snapshot_all(self, directory: Path) -> None:
        for name, table in self._tables.items():
            table.snapshot(Path(directory) / name)

    def restore_all(self, directory: Path) -> dict[str, int]:
        """Restore each table that has a snapshot under ``directory``; rows loaded by name."""
        loaded = {}
        for name, table in self._tables.items():
            if (Path(directory) / name / "manifest.json").exists():
                loaded[name] = table.restore(Path(directory) / name)
        return loaded

    def expire_all(self, now_s: float | None = None) -> int:
        return sum(table.expire(now_s) for table in self._tables.values())

    def close(self) -> None:
        try:
            for table in self._tables.values():
                table.close()
        finally:
            if self._owned_client is not None:
                self._owned_client.close()
                self._owned_client = None

    def __enter__(self) -> SparseTables:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
