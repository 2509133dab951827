"""The one settings tree of vidrec.

Built once at start (``Settings()`` reads ``VIDREC_*`` environment variables,
nested with ``__``: ``VIDREC_REDIS__URL``, ``VIDREC_SPARSE__BACKEND``) and
passed down; nothing reads the environment anywhere else. Every model forbids
unknown keys, so a mistyped setting fails at start instead of being ignored.

Each component owns one nested model. Later components (trainer, API) add
their own section here so that the whole configuration stays one document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from feature_store.errors import ConfigurationError


class _Section(BaseModel):
    """Base of every nested settings model: unknown keys are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RedisSettings(_Section):
    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (``redis://`` or ``rediss://``)."""
    cluster: bool = False
    """Treat ``url`` as a seed node of a Redis Cluster."""
    socket_timeout_s: float = Field(2.0, gt=0)
    """Seconds a single command may take before it is an error."""
    max_connections: int = Field(32, ge=1)
    """Size of the client's connection pool."""
    batch_chunk: int = Field(8192, ge=64)
    """Keys per pipelined round trip; bounds a single reply's size, not a batch."""


class KafkaSettings(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated ``host:port`` list."""
    client_id: str = "vidrec"
    partitions: int = Field(8, ge=1)
    """Partitions created for the events topic when vidrec creates it."""
    replication_factor: int = Field(1, ge=1)
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(3_000, ge=100)
    max_poll_interval_ms: int = Field(300_000, ge=1000)
    request_timeout_ms: int = Field(30_000, ge=1000)
    linger_ms: int = Field(5, ge=0)
    """Producer batching delay; a few ms trades latency for throughput."""


class EventLogSettings(_Section):
    backend: Literal["memory", "kafka"] = "memory"
    """``memory``: in-process log (embedded default); ``kafka``: Apache Kafka."""
    topic_namespace: str = Field("vidrec", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    """Prefix of every topic name, so several deployments can share a cluster."""
    memory_partitions: int = Field(4, ge=1, le=256)
    """Partitions of the in-process log (user_id decides the partition)."""
    memory_retention_records: int = Field(2_000_000, ge=1000)
    """Records kept per partition by the in-process log; older ones are dropped."""
    max_record_bytes: int = Field(64 * 1024, ge=512)
    """A record larger than this is dead-lettered without being decoded."""


class EventLimits(_Section):
    """Limits applied to every incoming event (HTTP and stream alike)."""

    max_id_length: int = Field(128, ge=8, le=1024)
    """Longest user, video, creator, event or recommendation id, in characters."""
    max_watch_ms: int = Field(24 * 3600 * 1000, ge=1000)
    """Largest accepted ``watch_ms`` and ``duration_ms`` (a day, in ms)."""
    future_tolerance_ms: int = Field(5 * 60 * 1000, ge=0)
    """How far an event's ``ts`` may lie ahead of the receiver's clock (clock skew)."""
    min_ts_ms: int = Field(946_684_800_000, ge=0)
    """Earliest accepted event time (2000-01-01); older timestamps are bugs."""
    max_tags: int = Field(32, ge=0, le=256)
    """Most tags a video may carry."""


class SparseSettings(_Section):
    """Sparse embedding tables (the trainer's parameter server)."""

    backend: Literal["memory", "redis"] = "memory"
    model_name: str = Field("main", pattern=r"^[A-Za-z0-9_-]{1,32}$")
    """Model family; every Redis key is namespaced by it so families never mix."""
    embedding_optimizer: Literal["adagrad", "adam"] = "adagrad"
    learning_rate: float = Field(0.05, gt=0)
    """Embedding learning rate (Adagrad's or Adam's step size)."""
    adagrad_initial_accumulator: float = Field(0.1, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    epsilon: float = Field(1e-8, gt=0)
    ftrl_alpha: float = Field(0.05, gt=0)
    ftrl_beta: float = Field(1.0, ge=0)
    ftrl_l1: float = Field(0.001, ge=0)
    ftrl_l2: float = Field(0.001, ge=0)
    init_scale: float = Field(0.05, ge=0)
    """Half-width of the uniform initializer of a new embedding row."""
    admission_threshold: int = Field(1, ge=1)
    """Sightings in training batches before a key gets a trained row (1: at once)."""
    ttl_s: float = Field(30 * 24 * 3600, gt=0)
    """Seconds after its last update that a row (and its state) disappears."""


class StoreSettings(_Section):
    """The catalog and the per-user / per-video activity store."""

    backend: Literal["memory", "redis"] = "memory"
    """``memory``: in-process, snapshotted to the data directory; ``redis``: shared."""


class FeatureSettings(_Section):
    history_length: int = Field(50, ge=1, le=1000)
    """Recent watches kept per user (feeds the history feature and candidates)."""
    history_in_model: int = Field(20, ge=1, le=200)
    """Most recent watches pooled into the history embedding."""
    watched_ratio_threshold: float = Field(0.3, ge=0, le=1)
    """Watch ratio from which a play counts as watched in the history."""


class Settings(BaseSettings):
    """Root of the settings tree."""

    model_config = SettingsConfigDict(
        env_prefix="VIDREC_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    environment: Literal["development", "production"] = "development"
    """``production`` refuses unsafe defaults (empty keys, development secrets)."""
    data_dir: Path = Path("./vidrec-data")
    """Snapshots of the embedded backends, the model registry and checkpoints."""
    redis: RedisSettings = RedisSettings()
    kafka: KafkaSettings = KafkaSettings()
    event_log: EventLogSettings = EventLogSettings()
    limits: EventLimits = EventLimits()
    sparse: SparseSettings = SparseSettings()
    stores: StoreSettings = StoreSettings()
    features: FeatureSettings = FeatureSettings()

    @model_validator(mode="after")
    def _enforce_production_safety(self) -> Settings:
        if self.environment == "production" and self.event_log.backend == "memory":
            # The in-process log cannot be shared by separate processes.
            raise ConfigurationError(
                "event_log.backend: 'memory' is for the embedded single process; "
                "production needs 'kafka'"
            )
        return self


def load_settings(**overrides: object) -> Settings:
    """Build the settings tree from the environment plus explicit overrides."""
    return Settings(**overrides)  # type: ignore[arg-type]
