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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from feature_store.errors import ConfigurationError
from feature_store.experiments import (
    ExperimentSpec,
    Head,
    RankingWeights,
)
from feature_store.heads import HEADS
from feature_store.keys import HOW_TO, MIN_LENGTH, key_weakness


def _fusion_weights() -> dict[str, float]:
    """The heads' default fusion weights (:attr:`~feature_store.heads.HeadSpec.fusion_weight`),
    those that are not 0."""
    return {h.name: h.fusion_weight for h in HEADS if h.fusion_weight}


def _loss_weights() -> dict[str, float]:
    """The heads' default loss multipliers (:attr:`~feature_store.heads.HeadSpec.loss_weight`)."""
    return {h.name: h.loss_weight for h in HEADS}


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
    max_connections: int = Field(128, ge=1)
    """Size of the client's connection pool, shared by a process's threads; a thread that
    finds every connection out waits up to ``socket_timeout_s`` for one. One recommend
    holds up to 14 at once (one per store and table read together), a trainer's batch
    about as many, so 32 was reached with the embedded trainer beside a few requests."""
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
    produce_timeout_ms: int = Field(600, ge=50)
    """Longest ``POST /v1/events`` waits for the broker's acknowledgement before it
    answers 503 with ``Retry-After`` (the events may still land: clients resend the
    same ``event_id``s, which the trainer trains once). Keeps an answer within 1 s."""
    # --- security: passed to every producer, consumer and admin client ---
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How clients talk to the brokers; ``SASL_SSL`` for a managed or shared cluster."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """SASL mechanism (``SASL_*`` protocols only)."""
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    """PEM file of the CA that signed the brokers' certificates (default: the system's)."""
    ssl_certfile: Path | None = None
    """PEM client certificate, for brokers that authenticate clients by TLS (mTLS)."""
    ssl_keyfile: Path | None = None
    """PEM private key of ``ssl_certfile``."""
    ssl_password: SecretStr | None = None
    """Password of ``ssl_keyfile``, if it is encrypted."""
    ssl_check_hostname: bool = True
    """Check that a broker's certificate names the host connected to."""

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username
                     or self.sasl_password is None):
            raise ConfigurationError(
                f"kafka.security_protocol={self.security_protocol} needs sasl_mechanism, "
                "sasl_username and sasl_password"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ConfigurationError(
                "kafka.sasl_mechanism: set security_protocol to SASL_SSL or SASL_PLAINTEXT"
            )
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)
        if not tls and any(f is not None for f in files):
            raise ConfigurationError(
                "kafka.ssl_*: TLS files are set but security_protocol is "
                f"{self.security_protocol} (use SSL or SASL_SSL)"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigurationError("kafka.ssl_certfile and kafka.ssl_keyfile go together")
        for name, path in (("ssl_cafile", self.ssl_cafile), ("ssl_certfile", self.ssl_certfile),
                           ("ssl_keyfile", self.ssl_keyfile)):
            if path is not None and not path.is_file():
                raise ConfigurationError(f"kafka.{name}: no file at {path}")
        return self


class EventLogSettings(_Section):
    backend: Literal["memory", "kafka"] = "memory"
    """``memory``: in-process log (embedded default); ``kafka``: Apache Kafka."""
    topic_namespace: str = Field("vidrec", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    """Prefix of every topic name, so several deployments can share a cluster."""
    memory_partitions: int = Field(4, ge=1, le=256)
    """Partitions of the in-process log (user_id decides the partition)."""
    memory_retention_records: int = Field(2_000_000, ge=1000)
    """Records kept per partition by the in-process log; older ones are dropped."""
    memory_persist: bool = True
    """Write the in-process log's records and committed offsets under
    ``data_dir/eventlog`` (a restart resumes from them). Off for a throwaway replay
    (``vidrec eval``), where each commit would rewrite the offsets file for nothing."""
    max_record_bytes: int = Field(64 * 1024, ge=512)
    """A record larger than this is dead-lettered without being decoded."""


class ServedLogSettings(_Section):
    """The served log: what the service recommended and the features it scored
    (:mod:`feature_store.served`), joined by the trainer to the events that follow."""

    enabled: bool = True
    """Log every model-ranked response. Off: the trainer featurises impressions from the
    stores as they arrive (still point in time, but recomputed rather than as scored)."""
    max_items: int = Field(50, ge=1, le=10_000)
    """Items of a response logged (its top ones): impressions of lower items are
    featurised from the stores when they arrive."""
    queue_records: int = Field(10_000, ge=1)
    """Responses waiting in the service for the log writer; beyond, new ones are dropped and
    counted (``vidrec_served_log_records_total{outcome="dropped"}``): logging never slows or
    fails a recommend."""
    memory_retention_records: int = Field(100_000, ge=1000)
    """Records kept per partition by the in-process log (a record is needed only until its
    impressions arrive)."""
    kafka_retention_ms: int = Field(24 * 3600 * 1000, ge=60_000)
    """``retention.ms`` of the served topic when vidrec creates it."""
    join_window_ms: int = Field(15 * 60 * 1000, ge=1000)
    """How long (log time) the trainer keeps a served record for its impressions to join."""
    join_max_records: int = Field(200_000, ge=1)
    """Served records the trainer holds at most (oldest forgotten first)."""
    join_lookahead_ms: int = Field(5_000, ge=0, le=600_000)
    """How far past an event's log time the trainer reads the served log before counting
    its record missing: the service's write delay (its queue) plus clock skew between the
    hosts. In real time a missing record holds its batch this long (``trainer/served.py``)."""
    join_max_wait_ms: int = Field(10_000, ge=0, le=120_000)
    """The longest a training batch waits for the served log to be read far enough (past
    the lookahead): past it, the events it names are featurised from the stores (counted
    ``late``). Keep it well under ``kafka.max_poll_interval_ms``: a trainer waiting longer
    is put out of its consumer group."""


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
    learning_rate: float = Field(0.5, gt=0)
    """Embedding learning rate (Adagrad's or Adam's step size). 0.5 for Adagrad, measured
    (docs/benchmarks.md, *Personal feeds*): on ml-100k the ranker alone's leave-one-out
    HR@10 0.458 at 0.05, 0.532 at 0.2, 0.547 at 0.5, 0.525 at 1.0; the demo learns its
    users' tastes in half the time. With Adam take about a hundredth of it."""
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
    history_length: int = Field(100, ge=1, le=1000)
    """Recent actions kept per user, positive and negative (feed the sequence and history
    features, the personal candidate sources and ``exclude_seen``)."""
    history_in_model: int = Field(20, ge=1, le=200)
    """Most recent watches pooled into the history embedding."""
    positive_watch_ratio: float = Field(0.5, ge=0, le=1)
    """Watch ratio (watched / duration) from which a play is a positive: the one threshold
    for the trainer's label, the user's history and co-visitation alike, so "what the
    user valued" means one thing everywhere."""
    short_watch_ratio: float = Field(0.1, ge=0, le=1)
    """A play that ends below this watch ratio is a rejection: the trainer's negative
    label and a ``short`` entry in the user's history (between the two ratios a play
    says nothing)."""
    text_vectors: Path | None = None
    """A local file of word vectors (GloVe / word2vec text format, ``.gz`` allowed): the
    title tokens' embedding rows start from them instead of at random
    (``feature_store/features/text_vectors.py``). Read once at start; nothing is
    downloaded."""
    user_attributes: bool = False
    """Add the user's age group, gender and occupation (from the event or request
    context, where clients send them) as columns, each crossed with the category.
    Changes the schema (and its hash): trainer and service must agree."""


DEVELOPMENT_API_KEY = "vidrec-dev-key"
"""Default write and admin key, accepted only with ``environment="development"``."""


DEFAULT_CANDIDATE_SOURCES = {
    "embedding": 0.3, "covisit": 0.2, "categories": 0.2, "creators": 0.1,
    "trending": 0.15, "fresh": 0.05,
}
"""Most of a known user's pool from what uses their history (0.8), the rest popular."""
CANDIDATE_SOURCE_NAMES = ("embedding", "covisit", "categories", "creators", "trending", "fresh")
_IMPERSONAL_SOURCES = ("trending", "fresh")


class ApiSettings(_Section):
    """The HTTP recommendation service (``app``) and its candidate signals."""

    api_key: SecretStr = SecretStr(DEVELOPMENT_API_KEY)
    """Key for writes (``POST /v1/events``, ``PUT /v1/videos``): ``X-API-Key`` or Bearer."""
    admin_key: SecretStr = SecretStr(DEVELOPMENT_API_KEY)
    """Key for admin calls (hide/unhide videos); also accepted for writes."""
    read_key: SecretStr | None = None
    """When set, reads (recommend, GET video, status) need this key (or a write/admin one)."""
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024)
    """Largest request body accepted, in bytes; larger bodies get 413 before parsing."""
    max_events_per_batch: int = Field(1000, ge=1, le=100_000)
    """Most events in one ``POST /v1/events``; more is a 413."""
    max_videos_per_batch: int = Field(1000, ge=1, le=100_000)
    """Most videos in one ``PUT /v1/videos``; more is a 413."""
    max_candidates: int = Field(500, ge=1, le=10_000)
    """Cap on the candidates scored per request (given or retrieved)."""
    max_count: int = Field(500, ge=1, le=10_000)
    """Largest ``count`` a caller may ask for."""
    max_recommend_batch: int = Field(100, ge=1, le=10_000)
    """Most users in one ``POST /v1/recommend/batch``; more is a 413. Each is a whole
    recommendation (a few ms of this worker's CPU), so 100 is about half a second."""
    default_count: int = Field(20, ge=1)
    """Items returned when the request names no ``count``."""
    source_limit: int = Field(300, ge=1)
    """Most candidates asked of one retrieval source (its share of ``max_candidates``, with
    room for the ones filtered out, is asked for, up to this)."""
    candidate_sources: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_CANDIDATE_SOURCES)
    )
    """Which candidate sources fill the pool, in what order, and each one's share of it
    (``app/candidates/sources.py``: ``embedding``, ``covisit``, ``categories``,
    ``creators``, ``trending``, ``fresh``). A user without history gets only the sources
    that need none (``trending``, ``fresh``), their shares scaled up; a source that finds
    fewer than its share leaves the rest to the others."""
    fresh_window_s: float = Field(7 * 24 * 3600, gt=0)
    """Fresh-upload candidates are videos uploaded within this many seconds."""
    model_poll_interval_s: float = Field(1.0, gt=0)
    """How often the service checks the registry's active version (hot swap delay)."""
    hot_row_cache_ttl_ms: int = Field(500, ge=0, le=1500)
    """ms a serving process reuses what it read or computed (0 disables): with Redis
    backends the catalog records, counters and sparse rows it read; with any, the cold
    start's anonymous score of each new video (``app/scoring/reference_cache.py``).
    Adds at most this to freshness (goal 2 s)."""
    onnx_provider: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto``: CUDA when a GPU is usable, CPU otherwise; the one in use is reported."""
    intra_op_threads: int = Field(1, ge=0, le=64)
    """ONNX Runtime threads per run (0: one per core). 1 keeps latency flat under load."""
    batch_buckets: tuple[int, ...] = (16, 64, 128, 256, 512)
    """Batch sizes the model is warmed for; a request is padded up to the next one."""
    fallback_refresh_s: float = Field(2.0, gt=0)
    """How often the degraded-mode popular list is refreshed while backends are up."""
    trending_half_life_s: float = Field(3600.0, gt=0)
    """Half-life of the trending counts' exponential decay, seconds of event time."""
    covisit_window: int = Field(10, ge=1, le=100)
    """Recent visits of a user paired with each new visit for co-visitation, and read
    as the co-visitation's seeds."""
    covisit_neighbors: int = Field(200, ge=1, le=10_000)
    """Neighbours kept per video in the co-visitation lists (strongest first). On
    ml-100k's leave-one-out, 100 instead of 200 costs the co-visitation term alone
    about 0.005 of HR@10."""
    covisit_decay: float = Field(0.8, gt=0, le=1)
    """Weight of a seed per position back in the user's recent visits, in the
    co-visitation cosine (``feature_store/signals/base.py``: ``cosine_scores``)."""
    creator_videos: int = Field(50, ge=1, le=10_000)
    """Newest uploads kept per creator for the creator candidate source."""
    category_videos: int = Field(200, ge=1, le=100_000)
    """Trending videos kept per category (the categories candidate source's depth)."""
    retrieval_weight: float = Field(0.5, ge=0, le=100)
    """Weight of the two-tower affinity (cosine, -1..1) in the ranking score, in
    log-probability units per unit of cosine; 0 ranks by the model alone. Chosen on
    validation queries of ml-100k, not the test split (``docs/retrieval.md``)."""
    sequence_weight: float = Field(1.0, ge=0, le=100)
    """Multiplier of the sequence tower's term in the ranking score (``sequence.enabled``):
    the term is this times the weight the trainer learns for the tower's logit
    (``trainer/sequence_weight.py``: the tower's logit in units of the ranker's log-odds,
    fit on the stream) times ``logit - best logit`` over the request's candidates.
    1.0: as learnt; 0: the term off."""
    factorization_weight: float = Field(0.8, ge=0, le=100)
    """Weight of the live matrix factorisation's score (``factorization.enabled``) in the
    ranking score, in log-probability units per standard deviation of the score over the
    request's candidates (``app/scoring/factorization.py``); 0: the term off. Chosen on
    ml-100k's second-to-last views with the other weights as they are
    (``bench/als_signal_screen.py --validate``), never on its test views."""
    covisit_weight: float = Field(1.5, ge=0, le=100)
    """Weight of ``log1p(co-visitation cosine / 0.1)`` in the ranking score, in
    log-probability units (``app/scoring/ranking.py``); the co-watch evidence the
    model's features do not carry directly. Chosen on ml-100k's leave-one-out with the
    other weights fixed (``docs/benchmarks.md``)."""
    signal_feed: bool = True
    """Run the signal feed (a consumer group updating trending, co-visitation and
    serving's histories and video counters, ``app/signal_feed.py``) in the service
    process. Turn off only where another process records them."""
    ranking_weights: RankingWeights = Field(default_factory=_fusion_weights)
    """Weight of each ranking head in the served score (dimensionless exponents, see
    ``app/scoring/fusion.py``): ``log score = sum |w| log p`` (``log(1 - p)`` for a
    negative weight), so the score stays in (0, 1] and ``{"engagement": 1}`` alone is
    the engagement probability. Each head's ``fusion_weight`` by default
    (``feature_store/heads.py``), engagement alone: on ml-100k it kept the
    service's recall@20 and NDCG@20, and engagement 1, watch 0.5, negative -1 lost a
    little of both (docs/benchmarks.md); try other weights in an experiment arm
    (``Arm.fusion``). A model from before heads is scored by engagement alone.
    JSON in the environment: ``VIDREC_API__RANKING_WEIGHTS='{"engagement": 1, "negative":
    -1}'``."""
    # --- overload: what a process admits, and how long an answer may take
    # (app/admission.py; docs/deploy.md, *Overload*) ---
    max_concurrent_recommends: int = Field(8, ge=1, le=10_000)
    """Recommends in flight at once in one process (scoring, or waiting for the scoring
    thread); one more is refused at once with 503 ``Overloaded`` and ``Retry-After``. The
    one scoring thread serves them in turn, so the last admitted waits about this many
    scorings (a few ms each on 2 cores): keep it well under the deadline's worth."""
    recommend_deadline_ms: int = Field(250, ge=10, le=60_000)
    """Longest a recommend takes from admission to answer, ms. One not scored by then is
    answered from the popular list (``degraded``, ``fallback_reason: "deadline"``); if its
    scoring had not started, it never starts."""
    max_concurrent_ingests: int = Field(8, ge=1, le=32)
    """``POST /v1/events`` in flight at once in one process; one more is refused at once
    with 503 ``Overloaded`` and ``Retry-After``. Each holds a thread of the web server's
    pool (40) while the broker acknowledges; the rest is left to the other routes."""
    ingest_deadline_ms: int = Field(1000, ge=100, le=60_000)
    """Longest an event post takes from admission to answer, ms: validation, then the
    broker's acknowledgement (at most ``kafka.produce_timeout_ms`` of it). Past it the
    answer is 503 with ``Retry-After``: resend the batch, with the same ``event_id``s."""
    shed_retry_after_s: int = Field(1, ge=1, le=3600)
    """``Retry-After`` of a request refused or past its deadline, s."""
    switch_interval_ms: float = Field(1.0, gt=0, le=100)
    """How often, ms, Python makes a thread holding the GIL hand it over, in ``vidrec
    serve`` and ``vidrec up`` (``sys.setswitchinterval``; Python's default is 5). The event
    loop waits up to this long for the scoring thread at each wake-up: at 3x the
    sustainable rate, 1 ms answered 0.80-0.82x the sustainable rate normally against
    0.67-0.68x at 5 ms (two alternated runs of ``bench/bench_overload.py``, 20 s each,
    docs/benchmarks.md)."""
    liveness_stuck_s: float = Field(60.0, ge=1, le=3600)
    """``/healthz`` answers 503 once one scoring has run this long, s: the scoring thread
    is stuck and only a restart frees it. Far above a scoring (ms) and any backend
    timeout (``redis.socket_timeout_s``), so a busy or degraded process stays alive."""
    min_head_samples: int = Field(1000, ge=0)
    """Training samples (as the version's manifest counts them) a head needs before the
    fusion uses it; fewer and its weight is ignored. An untrained head's output varies
    with the shared tower but predicts nothing (a log of finishes only never trains the
    watch head), and would reorder the ranking at random."""

    @model_validator(mode="after")
    def _check_buckets(self) -> ApiSettings:
        if not self.batch_buckets or list(self.batch_buckets) != sorted(set(self.batch_buckets)):
            raise ConfigurationError("api.batch_buckets: must be increasing and non-empty")
        if self.batch_buckets[-1] < self.max_candidates:
            raise ConfigurationError("api.batch_buckets: the largest must cover max_candidates")
        return self

    @model_validator(mode="after")
    def _check_sources(self) -> ApiSettings:
        unknown = sorted(set(self.candidate_sources) - set(CANDIDATE_SOURCE_NAMES))
        if unknown:
            raise ConfigurationError(
                f"api.candidate_sources: unknown {unknown} (known: {list(CANDIDATE_SOURCE_NAMES)})"
            )
        if any(not share > 0 for share in self.candidate_sources.values()):
            raise ConfigurationError("api.candidate_sources: every share must be above 0")
        if not set(self.candidate_sources) & set(_IMPERSONAL_SOURCES):
            raise ConfigurationError(
                "api.candidate_sources: needs trending or fresh, or a user without history "
                "gets no candidates"
            )
        return self


class RetrievalSettings(_Section):
    """The two-tower candidate source (``trainer/retrieval.py``, ``app/scoring/retrieval.py``).

    The trainer learns a user tower and a video tower beside the ranker, from the
    same stream; each export writes the user tower (ONNX) and every catalog
    video's vector into the version; the service proposes the user vector's
    nearest videos (source ``embedding``) and adds their affinity to the score.
    """

    enabled: bool = True
    """Train, export and serve the towers. Off: no ``tt_*`` tables, no ``embedding``
    source, and versions carry no towers (the service serves them either way)."""
    query: Literal["user", "history"] = "user"
    """What the service searches the video vectors with: ``user``, the user tower's
    vector (two-tower retrieval); ``history``, the normalised mean of the vectors of
    the user's ``api.covisit_window`` most recent watches (item-to-item over the
    learned video vectors). Chosen by measured recall (``docs/retrieval.md``)."""
    user_columns: tuple[str, ...] = ("user", "history", "device", "country", "surface")
    """Embedded feature columns (of the ranker's schema) the user tower pools: request
    and user scope only, so one vector per request."""
    video_columns: tuple[str, ...] = (
        "video", "creator", "category", "tags", "title", "duration",
    )
    """Embedded feature columns the video tower pools: video scope only, so a video's
    vector can be computed once per export from the catalog."""
    table_dim: int = Field(16, ge=2, le=256)
    """Width (floats) of every ``tt_*`` sparse table row; the towers' own tables, so
    the ranker's rows are not pulled in two directions."""
    hidden: int = Field(64, ge=1, le=4096)
    """Width of each tower's hidden layer (units)."""
    dim: int = Field(32, ge=2, le=1024)
    """Width of the L2-normalised user and video vectors (floats); the index's dimension."""
    temperature: float = Field(0.05, gt=0, le=10)
    """Softmax temperature of the in-batch loss (cosine units): 0.05 lets a cosine gap
    of 0.1 weigh like a factor e^2; larger values learn flatter, less selective vectors."""
    learning_rate: float = Field(2e-3, gt=0)
    """Adam step size of the towers' dense layers (the ``tt_*`` rows use the sparse
    optimizer of ``sparse.embedding_optimizer``)."""
    batch_size: int = Field(256, ge=2, le=65_536)
    """Positives per step; the other positives of a step are each one's negatives."""
    frequency_buckets: int = Field(1 << 20, ge=1024, le=1 << 26)
    """Hash buckets of the streaming video-frequency estimate (8 bytes each) used by
    the logQ correction; collisions only overestimate a video's frequency."""
    frequency_alpha: float = Field(0.05, gt=0, le=1)
    """Learning rate of the streaming estimate of the steps between a video's
    occurrences (Yi et al. 2019): higher follows popularity changes faster, noisier."""


class FactorizationSettings(_Section):
    """A matrix factorisation of the users' chosen videos (implicit ALS, Hu, Koren and
    Volinsky 2008), kept live by the trainer (``trainer/factorization.py``) from the
    views the sequence stage keeps (none while ``sequence.enabled`` is off).

    Every few hundred new (user, video) pairs it fits every video's and user's
    factor again; in between, each user with a new positive is folded in again
    (one least-squares solve against the current fit's videos) and written to the
    factor store at once, so a user's own actions move their score within a
    batch. The service adds ``api.factorization_weight`` times the score
    (standardised over the request's candidates) to the ranking. Screened on
    ml-100k before it was built (``bench/als_signal_screen.py``); the ALS
    settings are the evaluation's baseline's (``bench/tune_mf.py``, validation).
    """

    enabled: bool = True
    """Fit, publish and serve the factors (off while ``sequence.enabled`` is)."""
    factors: int = Field(32, ge=2, le=512)
    """Width of a factor (floats)."""
    regularization: float = Field(0.1, gt=0)
    """L2 weight on both factor matrices."""
    alpha: float = Field(5.0, gt=0)
    """Confidence of a chosen (user, video) pair against 1 for an unchosen one."""
    iterations: int = Field(15, ge=1, le=200)
    """Alternating passes of the first fit (from random factors)."""
    warm_iterations: int = Field(3, ge=1, le=200)
    """Alternating passes of every later fit, which starts from the previous fit's
    factors (new users and videos from random ones)."""
    refit_every: int = Field(500, ge=1)
    """New pairs between fits at most; fewer early on (a tenth of those fitted on, at
    least ``min_refit``)."""
    min_refit: int = Field(20, ge=1)
    """New pairs between fits at least."""
    refit_interval_s: float = Field(5.0, ge=0)
    """Online (``sequence.background``), seconds between the starts of two fits at least:
    a fit of a large log takes seconds of one core, the fold-ins in between keep each
    user current."""


class SequenceSettings(_Section):
    """The sequence tower: a SASRec-style causal transformer over each user's recent
    views, trained on next-view prediction beside the ranker (``trainer/sequence.py``,
    ``app/scoring/sequence.py``, ``docs/retrieval.md``).

    The trainer keeps each user's chosen videos in order and refits the tower
    (warm-started) every ``refit_every`` views; each export writes its encoder
    (ONNX) and every video's vector into the version; the service encodes the
    user's recent positive history and adds ``api.sequence_weight`` times the
    tower's logit of each candidate to the ranking. The defaults are the best of
    five settings tried on ml-100k's second-to-last views (``bench/seq_tower_screen.py
    --validate``), never on its test views.
    """

    enabled: bool = True
    """Train, export and serve the tower. Off: versions carry none and the ranking
    has no sequence term."""
    dim: int = Field(64, ge=4, le=1024)
    """Width of the item vectors and of the transformer (floats)."""
    blocks: int = Field(2, ge=1, le=8)
    """Causal self-attention blocks."""
    heads: int = Field(1, ge=1, le=16)
    """Attention heads per block (``dim`` must divide by it)."""
    max_len: int = Field(50, ge=2, le=512)
    """Newest views the tower reads (training windows and serving alike)."""
    dropout: float = Field(0.2, ge=0, lt=1)
    learning_rate: float = Field(3e-3, gt=0)
    """Adam step size (the tower is dense: item vectors are its own, not sparse tables)."""
    batch_size: int = Field(128, ge=1, le=65_536)
    """Windows per training step."""
    epochs: int = Field(6, ge=1, le=100)
    """Passes over the kept windows per refit (warm start: the same network and
    optimizer go on from the last refit)."""
    refit_every: int = Field(6000, ge=1)
    """Views between refits at most; fewer early on (a tenth of those fitted on, at
    least ``min_refit``), as a matrix factorisation is refit."""
    min_refit: int = Field(1000, ge=1)
    """Views between refits at least."""
    max_windows: int = Field(4096, ge=1)
    """Windows of ``max_len`` views a refit trains on at most (drawn at random when
    there are more): bounds a refit's CPU on a large log (ml-100k has about 2,500)."""
    views_per_user: int = Field(1000, ge=2)
    """Newest views kept per user (older ones drop out of training)."""
    max_views: int = Field(2_000_000, ge=100)
    """Views kept in all (4 bytes each); beyond it the least recently active users
    are dropped."""
    max_videos: int = Field(1_000_000, ge=10)
    """Videos the tower gives a vector; later ones are not scored by it until a
    restart (``dim`` floats each, twice with the optimizer's moments)."""
    sampled_above: int = Field(50_000, ge=1)
    """Above this many videos a training step scores the targets against
    ``negatives`` uniformly drawn videos instead of the whole catalog."""
    negatives: int = Field(4096, ge=1)
    background: bool = True
    """Refits (in a worker process either way) start when due and are published when
    done (the online trainer). Off, the exports pace them: a due refit starts at an
    export and is published at the next one whatever the machine's speed (the
    evaluation's replay: reproducible, point in time, the worker training while the
    replay goes on)."""

    @model_validator(mode="after")
    def _check_heads(self) -> SequenceSettings:
        if self.dim % self.heads:
            raise ConfigurationError(
                f"sequence.heads: {self.heads} does not divide sequence.dim {self.dim}"
            )
        return self


class RerankSettings(_Section):
    """What happens between scoring and the top-K: exclusions, demotions, diversity and
    cold start (``docs/rerank.md``)."""

    max_per_creator: int = Field(0, ge=0, le=10_000)
    """Most items of one creator in a response (a greedy pass in score order; 0: no cap).
    Off by default: a catalog with few creators would get short responses (the cap is strict,
    the response holds fewer items rather than break it)."""
    exclude_served: bool = False
    """Default of the request's ``exclude_served``: drop videos served to the user within
    ``served_window_s`` that got no engagement. Off by default so that a client asking twice
    in a row (a refresh, a test) gets the same page; feeds that page on should turn it on."""
    served_window_s: float = Field(3600.0, gt=0, le=30 * 24 * 3600)
    """Seconds (of the request's clock) a served-without-engagement video stays excluded;
    the stored entries expire after it, so the store holds at most one window per user."""
    served_max_per_user: int = Field(500, ge=1, le=100_000)
    """Served-without-engagement videos kept per user (newest kept): bounds the store at
    about 40 bytes each per active user."""
    dislikes_max_per_user: int = Field(1000, ge=1, le=100_000)
    """Disliked videos (and disliked creators) kept per user, newest kept. A disliked video
    never comes back while it is among them."""
    dislikes_ttl_s: float = Field(365 * 24 * 3600, gt=0)
    """Seconds a user's dislikes are kept after their latest one (Redis expiry; a year)."""
    dislike_creator_penalty: float = Field(0.5, ge=0, le=1)
    """Fraction of the score taken from a video whose creator the user disliked, right after
    the dislike: the score is multiplied by ``1 - penalty * 2**(-age / half_life)``, so the
    demotion is bounded (never below ``1 - penalty``) and fades."""
    dislike_penalty_half_life_s: float = Field(7 * 24 * 3600, gt=0)
    """Half-life of the creator demotion, seconds since the user's latest dislike of it."""
    new_video_impressions: int = Field(20, ge=1, le=100_000)
    """A video shown fewer times than this is *new*: it is scored from its calibrated prior
    moved by what the model and the user's own history say of this user (``app.cold_start``),
    toward the model's own score as its exposure grows, and it may take an exploration slot.
    Exposure counts impressions, or engaged views where clients log no impressions."""
    explore_max_age_s: float = Field(7 * 24 * 3600, gt=0)
    """Only videos uploaded within this many seconds (of the request's clock) may take an
    exploration slot: the budget is for new uploads, and an older video still short of
    impressions is unpopular rather than unknown (it keeps competing on its score)."""
    exploration_budget: float = Field(0.1, ge=0, le=1)
    """Share of a response's slots spent on new videos chosen by Thompson sampling (a
    fraction of ``count``, rounded at random so the average is exact; 0: no exploration)."""
    prior_strength: float = Field(10.0, gt=0)
    """Pseudo-impressions of a new video's Beta prior (at its category's rate): how many
    real impressions it takes for the video's own engagement to weigh as much as the prior."""
    category_shrinkage: float = Field(100.0, ge=0)
    """Pseudo-impressions shrinking a category's new-video rate toward the global one, so a
    category with few young videos gets nearly the global rate."""
    prior_refresh_s: float = Field(10.0, gt=0)
    """Seconds between re-estimates of the new-video rates from the counters serving holds."""
    own_evidence_strength: float = Field(2.0, gt=0)
    """Pseudo-entries shrinking a user's share of positive history entries in a new
    video's category toward their share overall (and in its creator toward the category's):
    how many of their own entries there weigh as much as the shrinkage. Small: a few of a
    user's own likes and skips order their new videos across categories (``app.cold_start``;
    why 2: ``docs/benchmarks.md``, *Personal feeds*)."""


class AnnSettings(_Section):
    """The nearest-neighbour index over the video vectors (``app.candidates.ann``).

    Why these defaults: ``docs/retrieval.md`` (*The index*) and the
    ``bench.bench_ann`` table in ``docs/benchmarks.md``.
    """

    exact_below: int = Field(20_000, ge=0)
    """Below this many vectors the index is an exact inner-product scan (numpy): at that
    size it is as fast as the approximate one and never misses a neighbour."""
    lists_per_sqrt: float = Field(4.0, gt=0, le=64)
    """IVF inverted lists per square root of the vector count (4: 4,000 lists at 10^6).
    More lists: each probe scans fewer vectors, but more probes are needed."""
    nprobe: int = Field(32, ge=1, le=4096)
    """Lists scanned per query. Recall@100 >= 0.95 on clustered vectors at 32 (the bench);
    higher costs query time roughly in proportion."""
    train_per_list: int = Field(64, ge=39, le=1024)
    """Training vectors per list for k-means (a seeded sample; fewer trains faster,
    faiss warns below 39)."""
    seed: int = 1234
    """Seed of the training sample and of k-means: processes building from the same
    vectors get the identical index."""
    build_threads: int = Field(1, ge=1, le=64)
    """Threads a (background) build uses. 1 leaves the other core to requests."""
    rebuild_changed_fraction: float = Field(0.05, gt=0, le=1)
    """Rebuild in the background once this share of the indexed vectors was added,
    updated or removed since the last build (they are searched exactly meanwhile)."""
    max_pending: int = Field(20_000, ge=1)
    """Rebuild once this many changed vectors wait, whatever the share: they are
    scanned exactly on every query (20,000 x 32 floats: about 0.1 ms)."""


class DashboardSettings(_Section):
    """The operators' page at ``/dashboard`` (``app.dashboard``).

    Viewing needs ``api.admin_key`` or ``viewer_key``; actions (export,
    promote, rollback, pause, resume, retrain) need the admin key.
    """

    viewer_key: SecretStr | None = None
    """Optional read-only key: sees the dashboard, cannot act. None: admin key only."""
    refresh_ms: int = Field(2000, ge=200, le=60_000)
    """How often the page polls for fresh figures, ms."""
    sample_every_s: float = Field(1.0, gt=0)
    """Seconds between samples of the serving metrics (rates, latency quantiles)."""
    rate_window_s: float = Field(10.0, gt=0)
    """Window over which requests/s, fallback rates and latency quantiles are computed, s."""
    history_points: int = Field(900, ge=10, le=100_000)
    """Serving samples kept in memory for the page's charts."""
    table_stats_every_s: float = Field(10.0, gt=0)
    """Seconds between sparse-table stats reads (a Redis table counts rows by SCAN)."""
    lag_warning_records: int = Field(10_000, ge=0)
    """Consumer lag above which a running trainer is shown as ``lagging``."""
    ack_timeout_s: float = Field(60.0, gt=0)
    """Longest an action waits for the trainer's final acknowledgement, s."""
    max_pending_actions: int = Field(100, ge=1, le=10_000)
    """Actions that may wait at once in one API process; more get 429. Waiting holds
    no thread (a coroutine each), so the bound is on memory and the control stream."""
    audit_shown: int = Field(100, ge=1, le=10_000)
    """Most recent audit entries shown on the page."""


class ExperimentSettings(_Section):
    """Experiments: users split between model families (``docs/experiments.md``).

    Definitions live in the model registry's directory (``experiments.json``),
    so every serving process sees the same ones; an admin creates, stops and
    concludes them on the dashboard. ``configured`` adds definitions from the
    settings at start.
    """

    configured: tuple[ExperimentSpec, ...] = ()
    """Experiments created at start when the registry has none of that id (one running at a
    time: a configured one is skipped, with a warning, while another runs). JSON in the
    environment: ``VIDREC_EXPERIMENTS__CONFIGURED='[{"id": "e1", "arms": [{"name": "a",
    "family": "main"}, {"name": "b", "family": "r20260101000000"}]}]'``."""
    metrics_feed: bool = True
    """Run the per-arm metrics feed (a consumer group joining events to the served log's
    arms) in the service process. Off where another serving process runs it."""
    attribution_window_ms: int = Field(10 * 60 * 1000, ge=1000, le=24 * 3600 * 1000)
    """Events count for a response's arm this long (log time) after it was served; later
    ones are ignored. Longer catches slower feedback (long watches) at the cost of memory:
    every impression of the window is held (about 200 bytes each)."""
    max_open_exposures: int = Field(200_000, ge=1000)
    """Impressions held per serving process while their window is open; beyond it the
    oldest are closed early (counted), so memory stays bounded."""
    checkpoint_every_s: float = Field(1.0, gt=0)
    """Seconds between saves of the per-partition totals (what the dashboard reads)."""


class TracingSettings(_Section):
    """OpenTelemetry tracing (``pip install -e ".[tracing]"``): off unless an endpoint is set.

    With no endpoint nothing is imported and no span is made; see
    ``docs/deploy.md`` (*Tracing*) for the spans and how a trace crosses the log.
    """

    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint, e.g. ``http://otel-collector:4318/v1/traces``. None: off."""
    service_name: str = Field("vidrec", min_length=1, max_length=64)
    """``service.name`` of the spans; the process's role is appended (``vidrec-api``,
    ``vidrec-trainer``, ``vidrec-embedded``)."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of new traces recorded (a request carrying a sampled ``traceparent`` is
    always recorded: parent-based)."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """Extra HTTP headers of the export requests (a collector's API key)."""
    timeout_s: float = Field(5.0, gt=0)
    """Longest an export request may take, s (spans are batched off the request path)."""


class TrainerSettings(_Section):
    """The online trainer (``vidrec train``, or a thread of ``vidrec up``).

    See ``docs/training.md`` for the label policy, the delivery guarantees
    and how these knobs trade freshness against throughput.
    """

    group_id: str = Field("vidrec-trainer", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    """Consumer group of the event log; also names the checkpoint directory."""
    batch_size: int = Field(1024, ge=1, le=1_000_000)
    """Events per micro-batch (events consumed, not samples produced)."""
    max_wait_ms: int = Field(200, ge=1, le=60_000)
    """Longest wait to fill a batch; a partial batch trains after this (ms)."""
    # --- label policy (see trainer/labels.py; a play's thresholds are
    # features.positive_watch_ratio and features.short_watch_ratio, shared with the
    # history and co-visitation) ---
    join_window_ms: int = Field(60_000, ge=1)
    """Event time an impression waits for a play of the same (user, video) (ms)."""
    joiner_max_entries: int = Field(200_000, ge=1)
    """Pending impressions kept; beyond it the oldest resolve early as negatives."""
    sample_weights: dict[str, float] = Field(default_factory=dict)
    """Per event type (``like``, ``skip``, ``impression``...) loss weight; 1 if absent.
    Applies to every head's loss term of the sample."""
    # --- ranking heads (trainer/labels.py, docs/training.md "Heads") ---
    head_loss_weights: dict[Head, float] = Field(default_factory=_loss_weights)
    """Multiplier of each head's summed loss (dimensionless; a head absent: its
    ``loss_weight``, ``feature_store/heads.py``). 0 stops a
    head learning (its output stays served); the engagement head is the one the wide part
    and the prequential ``auc`` follow, so it is the one to keep."""
    watch_duration_buckets_s: tuple[float, ...] = (15, 30, 60, 120, 300, 600, 1200)
    """Upper edges (seconds, increasing) of the duration buckets within which a play's
    watch ratio is ranked for the ``watch`` head's target; one more bucket above the last.
    Buckets, because a 10 s clip watched whole and a 40 min film watched half are not
    comparable: the quantile within videos of similar length is."""
    watch_quantile_memory: int = Field(100_000, ge=100)
    """Plays a duration bucket's watch-ratio histogram holds before its counts are halved:
    bounds the state and makes old plays weigh less, so the target follows drift
    (half-life of about this many plays of the bucket)."""

    @model_validator(mode="after")
    def _check_heads(self) -> TrainerSettings:
        edges = self.watch_duration_buckets_s
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)) or any(
            e <= 0 for e in edges
        ):
            raise ConfigurationError(
                "trainer.watch_duration_buckets_s: edges must be positive and increasing"
            )
        if any(w < 0 or w != w for w in self.head_loss_weights.values()):
            raise ConfigurationError("trainer.head_loss_weights: weights must be >= 0")
        return self
    # --- exactly-once bookkeeping ---
    dedupe_window: int = Field(500_000, ge=0)
    """Most recent event ids remembered; a repeat within them is not trained twice."""
    audit: bool = False
    """Debug: write every trained event id to ``<data_dir>/trainer/<group>/audit``."""
    # --- model ---
    hidden: tuple[int, ...] = (128, 64)
    """Widths of the deep part's hidden layers."""
    dense_learning_rate: float = Field(1e-3, gt=0)
    """Adam step size of the dense network (the sparse tables own their own)."""
    seed: int = 0
    """Seed of the dense network's initial weights."""
    threads: int = Field(1, ge=0)
    """torch intra-op threads for training (0: torch's default, one per core).

    1 by default: a batch's tensors are small, so extra threads buy little and,
    on a machine whose cores are busy (the API, decoding, Redis), OpenMP
    threads spin-waiting on each other made forward+backward 10-30x slower
    (measured on 2 cores: 7 ms per batch with 1 thread, 100-150 ms with 2)."""
    gc_threshold: int = Field(50_000, ge=0)
    """Allocations between young garbage collections while training (0: Python's 700).

    Training allocates many short-lived objects while the process holds
    millions of long-lived ones (tables, histories, the dedupe window);
    Python's default threshold made the collector take half of the loop's
    time (measured: 18.5k events/s at 700, 35k at 50,000). Set for the
    duration of ``run`` and restored after."""
    # --- export ---
    export_every_s: float = Field(60.0, ge=0)
    """Seconds between exports to the registry (0: never on a timer)."""
    export_every_batches: int = Field(0, ge=0)
    """Batches between exports (0: never by count)."""
    auto_activate: bool = True
    """Activate each export at once (else an operator activates it)."""
    registry_keep: int = Field(10, ge=1)
    """Versions kept by pruning after each export (the active one always stays)."""
    # --- checkpoints and metrics ---
    checkpoint_every_s: float = Field(30.0, gt=0)
    """Seconds between checkpoints; offsets are committed with each one."""
    checkpoints_kept: int = Field(2, ge=1)
    metrics_window: int = Field(20_000, ge=100)
    """Samples in the sliding window of prequential AUC and logloss."""
    metrics_every_s: float = Field(1.0, gt=0)
    """Seconds between points of the metrics time series (and heartbeats)."""
    timeseries_points: int = Field(10_000, ge=10)
    """Points the metrics time series keeps (memory ring / Redis stream MAXLEN)."""
    heartbeat_ttl_s: float = Field(15.0, gt=0)
    """A status heartbeat older than this means the trainer is gone. Also the TTL of the
    group's exporter lease and of a batch's partition claims (``trainer/distributed.py``):
    after a SIGKILL, the partitions the dead trainer was training resume within it."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """``vidrec train`` serves its Prometheus metrics on this port (0: off).

    Embedded in ``vidrec up`` the service exposes them instead (the
    component's ``metrics_registry``)."""
    metrics_host: str = "127.0.0.1"
    """Address the ``metrics_port`` listener binds: this host only unless set
    (``0.0.0.0`` in a container whose metrics are scraped from outside)."""
    # --- scale-out: several trainers in one group (trainer/distributed.py) ---
    group_sync: bool = False
    """Average the dense networks (ranker and towers) with the other trainers of
    ``group_id`` through Redis; needs ``sparse.backend=redis``. The group's progress and
    exporter lease need no setting: every trainer on the Redis tables keeps them
    (``trainer/distributed.py``)."""
    dense_sync_every_s: float = Field(5.0, gt=0)
    """Seconds between dense averaging rounds (with ``group_sync``); also the
    staleness bound of a peer's parameters when averaged."""
    dense_sync: Literal["redis", "gloo"] = "redis"
    """How the dense average is computed: ``redis`` (each trainer publishes its
    parameters and averages the peers' latest) or ``gloo`` (a torch.distributed
    all-reduce per round, in a background thread; membership through Redis)."""
    dense_sync_address: str | None = None
    """``gloo`` only: the address other trainers reach this one's rendezvous
    store at (default: the address of this host's name)."""


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
    served_log: ServedLogSettings = ServedLogSettings()
    limits: EventLimits = EventLimits()
    sparse: SparseSettings = SparseSettings()
    stores: StoreSettings = StoreSettings()
    features: FeatureSettings = FeatureSettings()
    trainer: TrainerSettings = TrainerSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    sequence: SequenceSettings = SequenceSettings()
    factorization: FactorizationSettings = FactorizationSettings()
    api: ApiSettings = ApiSettings()
    rerank: RerankSettings = RerankSettings()
    ann: AnnSettings = AnnSettings()
    dashboard: DashboardSettings = DashboardSettings()
    experiments: ExperimentSettings = ExperimentSettings()
    tracing: TracingSettings = TracingSettings()

    @model_validator(mode="after")
    def _enforce_production_safety(self) -> Settings:
        if self.environment == "production" and self.event_log.backend == "memory":
            # The in-process log cannot be shared by separate processes.
            raise ConfigurationError(
                "event_log.backend: 'memory' is for the embedded single process; "
                "production needs 'kafka'"
            )
        if self.environment == "production":
            check_production_keys(self)
        if self.api.liveness_stuck_s <= 2 * self.redis.socket_timeout_s:
            raise ConfigurationError(
                "api.liveness_stuck_s: must exceed twice redis.socket_timeout_s, or a "
                "scoring waiting on a slow Redis would get the process restarted"
            )
        return self


def check_production_keys(settings: Settings) -> None:
    """Refuse guessable, default or shared keys (each role needs its own key); what
    guessable means is :mod:`feature_store.keys`."""
    keys = {
        "api.api_key": settings.api.api_key,
        "api.admin_key": settings.api.admin_key,
        "api.read_key": settings.api.read_key,
        "dashboard.viewer_key": settings.dashboard.viewer_key,
    }
    seen: dict[str, str] = {}
    for name, secret in keys.items():
        if secret is None:
            continue
        key = secret.get_secret_value()
        weakness = (
            "the development default" if key == DEVELOPMENT_API_KEY else key_weakness(key)
        )
        if weakness is not None:
            raise ConfigurationError(
                f"{name}: production refuses this key, {weakness}; use a random key of at "
                f"least {MIN_LENGTH} characters: {HOW_TO}"
            )
        if key in seen:
            raise ConfigurationError(
                f"{name}: the same key as {seen[key]}; each role needs its own key ({HOW_TO})"
            )
        seen[key] = name


def load_settings(**overrides: object) -> Settings:
    """Build the settings tree from the environment plus explicit overrides."""
    return Settings(**overrides)  # type: ignore[arg-type]
