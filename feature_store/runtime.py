"""Open every storage component a process needs, from one settings tree.

:class:`Resources` is the set of live objects the trainer and the service
share: the event log, the sparse tables, the catalog, the activity store and
the model registry. In embedded mode (``vidrec up``) one ``Resources`` is
opened by the service and handed to the in-process trainer, so both work on
the same in-memory tables; in production each process opens its own against
Kafka and Redis. Whoever opens it closes it (``with open_resources(...)``);
``close`` snapshots the embedded backends to the data directory first, so a
restart keeps what was learned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feature_store.features.schema import WIDE_TABLE, FeatureSchema, default_schema
from feature_store.registry import ModelRegistry
from feature_store.settings import Settings

if TYPE_CHECKING:
    import redis

    from feature_store.activity.base import ActivityStore
    from feature_store.catalog.base import CatalogStore
    from feature_store.eventlog.base import EventLog
    from feature_store.sparse.base import SparseTable

log = logging.getLogger(__name__)


@dataclass
class Resources:
    """Live storage objects of one process; see the module docstring."""

    settings: Settings
    schema: FeatureSchema
    event_log: EventLog
    catalog: CatalogStore
    activity: ActivityStore
    registry: ModelRegistry
    tables: dict[str, SparseTable]
    """Embedding tables by name plus the wide table (``WIDE_TABLE``)."""
    redis_client: redis.Redis | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    """Components added by later layers (e.g. candidate signals), closed in reverse."""

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def embedded(self) -> bool:
        """True when state lives in this process and is snapshotted to disk."""
        return self.settings.sparse.backend == "memory"

    def snapshot(self) -> None:
        """Persist every in-process backend under the data directory."""
        if self.settings.sparse.backend == "memory":
            for name, table in self.tables.items():
                table.snapshot(self.data_dir / "sparse" / name)
        if self.settings.stores.backend == "memory":
            self.catalog.snapshot(self.data_dir / "catalog")
            self.activity.snapshot(self.data_dir / "activity")

    def restore(self) -> None:
        """Load snapshots written by :meth:`snapshot`, where present."""
        if self.settings.sparse.backend == "memory":
            for name, table in self.tables.items():
                if _has_snapshot(self.data_dir / "sparse" / name):
                    table.restore(self.data_dir / "sparse" / name)
        if self.settings.stores.backend == "memory":
            if _has_snapshot(self.data_dir / "catalog"):
                self.catalog.restore(self.data_dir / "catalog")
            if _has_snapshot(self.data_dir / "activity"):
                self.activity.restore(self.data_dir / "activity")

    def close(self) -> None:
        try:
            self.snapshot()
        except Exception:  # a failed snapshot must not leak open clients
            log.exception("snapshot on close failed")
        for extra in reversed(list(self.extras.values())):
            close = getattr(extra, "close", None)
            if close is not None:
                close()
        for table in self.tables.values():
            table.close()
        self.activity.close()
        self.catalog.close()
        self.event_log.close()
        if self.redis_client is not None:
            self.redis_client.close()


def _has_snapshot(directory: Path) -> bool:
    """A snapshot directory with something in it (an empty one is a crash leftover)."""
    return directory.is_dir() and any(p for p in directory.iterdir() if not p.name.startswith("."))


def table_specs(schema: FeatureSchema, settings: Settings) -> list[Any]:
    """Specs of every sparse table the schema needs."""
    from feature_store.sparse.base import TableSpec

    optimizer = settings.sparse.embedding_optimizer
    specs = [TableSpec(name, dim, optimizer) for name, dim in schema.table_dims().items()]
    return [*specs, TableSpec(WIDE_TABLE, 1, "ftrl")]


def needs_redis(settings: Settings) -> bool:
    return settings.sparse.backend == "redis" or settings.stores.backend == "redis"


def open_redis(settings: Settings) -> redis.Redis:
    """A redis-py client for the configured server, with a short retry policy.

    redis-py's default (10 retries with backoff) would stall a request or a
    batch for seconds when Redis is down; callers prefer a fast, clear error
    and their own fallback.
    """
    from feature_store.sparse.factory import connect_redis

    return connect_redis(settings.redis)


@contextmanager
def open_resources(
    settings: Settings, schema: FeatureSchema | None = None, *, model_name: str | None = None
) -> Iterator[Resources]:
    """Open everything per ``settings``; snapshot and close on exit.

    ``model_name`` overrides ``settings.sparse.model_name`` for the sparse
    tables (a retrain family trains beside the live one in its own namespace).
    """
    from feature_store.activity import open_activity
    from feature_store.catalog import open_catalog
    from feature_store.eventlog import open_event_log
    from feature_store.sparse import open_table

    schema = schema or default_schema(settings.features)
    if model_name is not None:
        sparse = settings.sparse.model_copy(update={"model_name": model_name})
        settings = settings.model_copy(update={"sparse": sparse})
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    client = open_redis(settings) if needs_redis(settings) else None
    store_client = client if settings.stores.backend == "redis" else None
    resources = Resources(
        settings=settings,
        schema=schema,
        event_log=open_event_log(settings, data_dir=data_dir / "eventlog"),
        catalog=open_catalog(settings, redis_client=store_client, data_dir=data_dir / "catalog"),
        activity=open_activity(settings, redis_client=store_client, data_dir=data_dir / "activity"),
        registry=ModelRegistry(data_dir / "registry"),
        tables={
            spec.name: open_table(spec, settings, redis_client=client)
            for spec in table_specs(schema, settings)
        },
        redis_client=client,
    )
    try:
        resources.restore()
        yield resources
    finally:
        resources.close()
