"""Open every storage component a process needs, from one settings tree.

:class:`Resources` is the set of live objects the trainer and the service
share: the event log, the sparse tables, the catalog, the activity stores
(serving's, and the trainer's own point-in-time copy), the model registry,
the retrain families' tables, the control channel and the trainer's metrics
series. In embedded mode (``vidrec up``) one ``Resources`` is opened by the
service and handed to the in-process trainer, so both work on the same
in-memory tables; in production each process opens its own against Kafka
and Redis.

Ownership: :func:`open_resources` opens every part, hands them to
``Resources`` at construction, and closes them on exit (``Resources.close``,
after a snapshot of the embedded backends to the data directory, so a
restart keeps what was learned). No other module sets a field. Parts only
one component uses are that component's: the service opens and closes its
candidate signals and feedback (``app/service.py``), the trainer its loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feature_store.factors import FactorStore, MemoryFactors, open_factors
from feature_store.features.schema import WIDE_TABLE, FeatureSchema, default_schema
from feature_store.models.registry import ModelRegistry
from feature_store.runtime.breaker import redis_breaker
from feature_store.settings import Settings

if TYPE_CHECKING:
    import redis

    from feature_store.activity.base import ActivityStore
    from feature_store.catalog.base import CatalogStore
    from feature_store.eventlog.base import EventLog
    from feature_store.ops.control import ControlChannel
    from feature_store.ops.timeseries import MetricsSeries
    from feature_store.sparse.base import SparseTable

log = logging.getLogger(__name__)

@dataclass(frozen=True, eq=False)
class Resources:
    """Live storage objects of one process; see the module docstring.

    Frozen: every part comes in at construction, from whoever opened it
    (:func:`open_resources`), which closes it."""

    settings: Settings
    schema: FeatureSchema
    event_log: EventLog
    catalog: CatalogStore
    activity: ActivityStore
    """Serving's histories and video counters (exclude_seen, history and counter features,
    co-visitation, cold start), written by the service's signal feed as events arrive,
    whether a trainer runs or not (``app/signal_feed.py``)."""
    training_activity: ActivityStore
    """The trainer's own copy, written only by the trainer after each batch it trained, so
    a sample's features are the state before its moment however far serving's copy ran
    ahead (``trainer/samples.py``). Its own Redis keys; in process, checkpointed with the
    trainer. Twice the activity memory, for exact point-in-time features: filtering
    serving's histories by time cannot give back an entry a later event rewrote or pushed
    out, nor the counters as they stood."""
    registry: ModelRegistry
    tables: dict[str, SparseTable]
    """Embedding tables by name plus the wide table (``WIDE_TABLE``)."""
    control: ControlChannel
    """The control channel (``feature_store.ops.control``): embedded, the dashboard and the
    trainer's listener share this one object; with Redis stores, a client of the streams."""
    trainer_series: MetricsSeries
    """The metrics series and heartbeat of this process's trainer (``trainer.group_id``):
    the trainer writes it, the dashboard reads it (embedded: this object, live in memory)."""
    redis_client: redis.Redis | None = None
    factors: FactorStore = field(default_factory=MemoryFactors)
    """The live factorisation's factors (``feature_store/factors``): the trainer writes
    them, the service reads them at each request."""
    served_log: EventLog | None = None
    """The served log (what the service recommended, with the features it scored), beside
    the event log; None when ``served_log.enabled`` is off."""
    families: Families = field(init=False)
    """The model families this process can serve (its own and retrain families' tables);
    made with the resources, closed by them."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "families", Families(self))  # made with the object

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
            self.families.snapshot()
        if self.settings.stores.backend == "memory":
            self.catalog.snapshot(self.data_dir / "catalog")
            self.activity.snapshot(self.data_dir / "activity")
            if isinstance(self.factors, MemoryFactors):
                self.factors.snapshot(self.data_dir / "factors")

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
            if isinstance(self.factors, MemoryFactors):
                self.factors.restore(self.data_dir / "factors")

    def close(self) -> None:
        try:
            self.snapshot()
        except Exception:  # a failed snapshot must not leak open clients
            log.exception("snapshot on close failed")
        # Opened last by open_resources (families with the object), so closed first.
        self.families.close()
        self.trainer_series.close()
        self.control.close()
        for table in self.tables.values():
            table.close()
        self.training_activity.close()
        self.activity.close()
        self.catalog.close()
        if self.served_log is not None:
            self.served_log.close()
        self.event_log.close()
        if self.redis_client is not None:
            _close_redis(self.redis_client)


def _close_redis(client: redis.Redis) -> None:
    """Close ``client`` and stop its circuit breaker's prober, if it has one."""
    breaker = redis_breaker(client)
    if breaker is not None:
        breaker.close()
    client.close()


class Families:
    """The sparse tables of every model family this process can serve.

    A model version belongs to the family whose tables it was trained on
    (``Manifest.family``, the tables' ``sparse.model_name``). The process's own
    family is ``Resources.tables``; another one is found here:

    - **embedded** (memory tables): a retrain family's tables live in the
      trainer's memory; :class:`~trainer.retrain.RetrainManager`
      registers them (:meth:`register`) when it starts the family. They are
      snapshotted with the process under ``<data_dir>/families/<family>`` and
      reopened from there after a restart, so a promoted family still serves;
    - **Redis**: the tables are opened under the family's ``model_name`` on the
      same client, once a row of the family's wide table is seen (the trainer
      of the family may run in another process).

    A family found in neither place is unknown (``None``): serving refuses its
    versions. Tables opened here are closed here; registered ones belong to
    whoever registered them.
    """

    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self._registered: dict[str, dict[str, SparseTable]] = {}
        self._opened: dict[str, dict[str, SparseTable]] = {}
        self._lock = threading.Lock()

    def register(self, family: str, tables: dict[str, SparseTable]) -> None:
        with self._lock:
            self._registered[family] = tables

    def tables(self, family: str) -> dict[str, SparseTable] | None:
        """``family``'s tables, or None when it has none this process can find."""
        live = self.resources
        if family == live.settings.sparse.model_name:
            return live.tables
        with self._lock:
            found = self._registered.get(family) or self._opened.get(family)
            if found is None:
                found = self._open(family)
                if found is not None:
                    self._opened[family] = found
            return found

    def _open(self, family: str) -> dict[str, SparseTable] | None:
        from feature_store.sparse import open_table

        live = self.resources
        sparse = live.settings.sparse.model_copy(update={"model_name": family})
        settings = live.settings.model_copy(update={"sparse": sparse})
        if settings.sparse.backend == "memory":
            directory = live.data_dir / "families" / family
            if not all(_has_snapshot(directory / n) for n in live.tables):
                return None
            tables = {s.name: open_table(s, settings) for s in table_specs(live.schema, settings)}
            for name, table in tables.items():
                table.restore(directory / name)
            return tables
        if not _family_in_redis(live, family):
            return None
        return {
            spec.name: open_table(spec, settings, redis_client=live.redis_client)
            for spec in table_specs(live.schema, settings)
        }

    def snapshot(self) -> None:
        """Persist registered embedded families (beside the live tables' snapshot)."""
        with self._lock:
            families = {**self._opened, **self._registered}
        for family, tables in families.items():
            for name, table in tables.items():
                table.snapshot(self.resources.data_dir / "families" / family / name)

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, {}
            self._registered.clear()
        for tables in opened.values():
            for table in tables.values():
                table.close()


def _family_in_redis(resources: Resources, family: str) -> bool:
    """Whether any of the family's tables has a row (SCAN, stopping at the first hit)."""
    import redis

    from feature_store.constants import REDIS_ROOT, SPARSE_ROWS
    from feature_store.sparse import open_table

    client = resources.redis_client
    if client is None:
        return False
    if not isinstance(client, redis.Redis):  # a cluster: ask the tables themselves
        sparse = resources.settings.sparse.model_copy(update={"model_name": family})
        settings = resources.settings.model_copy(update={"sparse": sparse})
        return any(
            open_table(spec, settings, redis_client=client).stats().rows > 0
            for spec in table_specs(resources.schema, settings)
        )
    # Rows only (family ids are [A-Za-z0-9_-]): not admission counters, nor keys
    # of the layout before one-key rows, which nothing reads any more.
    match = f"{REDIS_ROOT}:sp:{family}:*:{SPARSE_ROWS}:*".encode()
    return next(iter(client.scan_iter(match=match, count=10_000)), None) is not None


def _has_snapshot(directory: Path) -> bool:
    """A snapshot directory with something in it (an empty one is a crash leftover)."""
    return directory.is_dir() and any(p for p in directory.iterdir() if not p.name.startswith("."))


def table_specs(schema: FeatureSchema, settings: Settings) -> list[Any]:
    """Specs of every sparse table the schema needs."""
    from feature_store.models.retrieval_io import Towers
    from feature_store.sparse.base import TableSpec

    optimizer = settings.sparse.embedding_optimizer
    dims = dict(schema.table_dims())
    if settings.retrieval.enabled:  # the two-tower model's own tables (tt_*)
        dims.update(Towers.from_settings(schema, settings.retrieval).tables)
    preset = text_presets(schema, settings, dims)
    specs = [TableSpec(name, dim, optimizer, preset.get(name)) for name, dim in dims.items()]
    return [*specs, TableSpec(WIDE_TABLE, 1, "ftrl")]


def text_presets(
    schema: FeatureSchema, settings: Settings, dims: dict[str, int]
) -> dict[str, dict[int, Any]]:
    """Initial rows of the tables that hold title tokens, from ``features.text_vectors``
    (:mod:`feature_store.features.text_vectors`); none without that file."""
    path = settings.features.text_vectors
    if path is None:
        return {}
    from feature_store.features.text_vectors import presets, read_vectors
    from feature_store.models.retrieval_io import tower_table

    words, vectors = read_vectors(path)
    out: dict[str, dict[int, Any]] = {}
    scale = settings.sparse.init_scale
    for col in schema.multi_valued:
        if col.source != "title_tokens":
            continue
        for table in (col.table_name(), tower_table(col.table_name())):
            if table in dims:
                out[table] = presets(words, vectors, col.space(), table, dims[table], scale)
    return out


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
    settings: Settings,
    schema: FeatureSchema | None = None,
    *,
    model_name: str | None = None,
    wait_for_event_log: bool = True,
) -> Iterator[Resources]:
    """Open everything per ``settings``; snapshot and close on exit.

    ``model_name`` overrides ``settings.sparse.model_name`` for the sparse
    tables (a retrain family trains beside the live one in its own namespace).
    ``wait_for_event_log=False`` (the service) connects to Kafka in the
    background instead of failing when no broker answers at start.
    """
    from feature_store.activity import open_activity
    from feature_store.catalog import open_catalog
    from feature_store.eventlog import open_event_log
    from feature_store.ops.control import open_control
    from feature_store.ops.timeseries import open_timeseries
    from feature_store.sparse import open_table

    schema = schema or default_schema(settings.features)
    if model_name is not None:
        sparse = settings.sparse.model_copy(update={"model_name": model_name})
        settings = settings.model_copy(update={"sparse": sparse})
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    # Each client is closed if a later one fails to open; once all are open,
    # ``Resources.close`` owns them (pop_all).
    with ExitStack() as opened:
        client = open_redis(settings) if needs_redis(settings) else None
        if client is not None:
            opened.callback(_close_redis, client)
        store_client = client if settings.stores.backend == "redis" else None
        event_log = open_event_log(
            settings,
            data_dir=data_dir / "eventlog" if settings.event_log.memory_persist else None,
            wait=wait_for_event_log,
        )
        opened.callback(event_log.close)
        catalog = open_catalog(settings, redis_client=store_client, data_dir=data_dir / "catalog")
        opened.callback(catalog.close)
        activity = open_activity(
            settings, redis_client=store_client, data_dir=data_dir / "activity"
        )
        opened.callback(activity.close)
        training_activity = open_activity(settings, redis_client=store_client, training=True)
        opened.callback(training_activity.close)
        tables: dict[str, SparseTable] = {}
        for spec in table_specs(schema, settings):
            tables[spec.name] = table = open_table(spec, settings, redis_client=client)
            opened.callback(table.close)
        served_log = None
        if settings.served_log.enabled:
            served_log = open_event_log(
                settings, data_dir=data_dir / "eventlog", stream="served", wait=wait_for_event_log
            )
            opened.callback(served_log.close)
        control = open_control(settings, store_client)
        opened.callback(control.close)
        trainer_series = open_timeseries(settings, store_client)
        opened.callback(trainer_series.close)
        resources = Resources(
            settings=settings,
            schema=schema,
            event_log=event_log,
            catalog=catalog,
            activity=activity,
            training_activity=training_activity,
            registry=ModelRegistry(data_dir / "registry"),
            tables=tables,
            control=control,
            trainer_series=trainer_series,
            redis_client=client,
            factors=open_factors(settings, store_client),
            served_log=served_log,
        )
        opened.pop_all()
    try:
        resources.restore()
        yield resources
    finally:
        resources.close()
