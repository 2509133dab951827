"""The live parts of one service instance, opened and closed together.

:func:`open_service` builds, over an open :class:`~feature_store.runtime.resources.Resources`,
everything a request needs: the candidate signals, the scorer, the model
holder (with its hot-swap thread), the popular list for the degraded
fallback, the recommender and the metrics. It is a context manager so that
the lifespan in :mod:`app.main` closes every thread it started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from app.admission import ScoringThread
from app.cache import CachedReads
from app.candidates.retrieval import Retriever
from app.experiments.arms import ArmModels
from app.experiments.checkpoints import FeedCheckpoints, open_checkpoints
from app.experiments.feed import ExperimentFeed, run_experiment_feed
from app.metrics import Metrics
from app.recommender import PopularList, PopularRefresher, Recommender
from app.rerank import Reranker
from app.scoring.fusion import Fusion
from app.scoring.onnx_model import LoadedModel, ModelHolder, ModelLoadError, load_model
from app.scoring.scorer import Scorer
from app.scoring.video_table import video_source
from app.served_log import ServedLogWriter
from app.signal_feed import SignalFeed, run_signal_feed
from feature_store.events import EventValidator
from feature_store.experiments import ExperimentSpec, ExperimentStore
from feature_store.features.values import layout_of
from feature_store.ops.timeseries import MetricsSeries
from feature_store.recommendation_ids import RecommendationIds
from feature_store.runtime import tracing
from feature_store.runtime.breaker import Breaker, redis_breaker
from feature_store.runtime.log_summary import LogSummary
from feature_store.runtime.resources import Resources
from feature_store.signals import CandidateSignals, serving_signals
from feature_store.signals.feedback import UserFeedback, serving_feedback

log = logging.getLogger(__name__)


class TrainerView(Protocol):
    """What the service reads of a trainer running in its process (``/v1/status``, dashboard).

    Structural, so the service never imports ``trainer``: the composition root
    (``app.wiring``) hands it the trainer it started.
    """

    def status(self) -> dict[str, Any]:
        """State (running, paused, stopped), counters and latest metrics."""
        ...


@runtime_checkable
class DemoView(Protocol):
    """What the dashboard shows of the demo's simulated users (``app/demo.py``)."""

    def figures(self) -> dict[str, float | int | None]:
        """Sessions, play rate and the personalisation figure of the last window."""
        ...


class RetrainFamilyView(Protocol):
    """One retrain family, as the dashboard shows it."""

    @property
    def id(self) -> str: ...

    @property
    def series(self) -> MetricsSeries | None:
        """The family's metrics series (its points on the dashboard's chart)."""
        ...

    def describe(self) -> dict[str, Any]:
        """State, progress and the family's trainer status."""
        ...


class RetrainView(Protocol):
    """The retrain families a trainer in this process runs (``trainer.retrain``)."""

    @property
    def families(self) -> Mapping[str, RetrainFamilyView]: ...


@dataclass(frozen=True)
class InProcessTrainer:
    """A trainer running in the service's process (``vidrec up``), as the service sees it."""

    trainer: TrainerView
    retrain: RetrainView | None = None
    """Its retrain families."""


TrainerOpener = Callable[[Resources, Metrics], AbstractContextManager[InProcessTrainer]]
"""Opens (and on exit stops) a trainer in the service's process: handed to
:func:`open_service` by the composition root (``app.wiring.embedded_trainer``), so the
service never imports ``trainer``."""


@dataclass
class Service:
    """What the routes use; one per app, on ``app.state.service``."""

    resources: Resources
    reads: CachedReads
    signals: CandidateSignals
    """Trending, co-visitation, creator uploads: opened and closed by :func:`open_service`."""
    feedback: UserFeedback
    """Served-without-engagement and dislikes per user (the rerank): opened and closed by
    :func:`open_service`."""
    metrics: Metrics
    scorer: Scorer
    holder: ModelHolder
    retriever: Retriever
    popular: PopularList
    recommender: Recommender
    validator: EventValidator
    log_summary: LogSummary
    """Per-request warnings (degraded answers, 5xx, refusals) as one line per interval."""
    scoring: ScoringThread
    """The thread recommends are scored on, off the event loop (:mod:`app.admission`)."""
    feed: SignalFeed | None = None
    """The signal feed, when this process runs it (``api.signal_feed``)."""
    experiments: ExperimentStore | None = None
    arms: ArmModels | None = None
    experiment_feed: ExperimentFeed | None = None
    """The experiment metrics feed, when this process runs it (``experiments.metrics_feed``)."""
    experiment_checkpoints: FeedCheckpoints | None = None
    trainer: TrainerView | None = None
    """The trainer running in this process (``vidrec up``), opened and stopped by
    :func:`open_service`; None when the trainer is a separate process (its heartbeat is
    read)."""
    retrain: RetrainView | None = None
    """That trainer's retrain families."""
    started_at: float = field(default_factory=time.time)

    @property
    def model(self) -> LoadedModel | None:
        return self.holder.current

    def dependencies(self) -> dict[str, Breaker]:
        """The circuit breakers of this process's external dependencies, by name."""
        found: dict[str, Breaker] = {}
        redis_state = redis_breaker(self.resources.redis_client)
        if redis_state is not None:
            found["redis"] = redis_state
        log_state = getattr(self.resources.event_log, "breaker", None)
        if isinstance(log_state, Breaker):
            found["event_log"] = log_state
        return found


def _up_of(breaker: Breaker) -> Callable[[], float]:
    """``vidrec_dependency_up``'s value for one dependency, read at scrape time."""
    return lambda: float(breaker.up)


@contextmanager
def open_service(
    resources: Resources, metrics: Metrics | None = None, trainer: TrainerOpener | None = None
) -> Iterator[Service]:
    """Build the service over ``resources``; load the active model; start background threads.

    The candidate signals and the feedback are the service's own: opened here
    (restored from the data directory in memory) and closed (snapshotted) after
    every thread that writes them has stopped. So are its feeds and, with
    ``trainer``, the trainer of its process: opened last, stopped first.
    """
    with serving_signals(resources) as signals, serving_feedback(resources) as feedback:
        with _open_service(
            resources, metrics or Metrics(), signals, feedback, trainer
        ) as service:
            yield service


@contextmanager
def _open_service(
    resources: Resources,
    metrics: Metrics,
    signals: CandidateSignals,
    feedback: UserFeedback,
    trainer: TrainerOpener | None,
) -> Iterator[Service]:
    settings = resources.settings
    api = settings.api
    if tracing.enabled():  # spans per recommend stage (nothing wrapped when off)
        metrics.observe_stage = tracing.stage_observer(metrics.observe_stage)  # type: ignore[method-assign,assignment]
    reads = CachedReads(
        resources.catalog,
        resources.tables,
        api.hot_row_cache_ttl_ms,
        enabled=settings.stores.backend == "redis" or settings.sparse.backend == "redis",
    )
    videos = video_source(  # the same staleness bounds as the read cache's
        resources.catalog,
        resources.activity,
        record_ttl_s=reads.catalog_ttl_s,
        stats_ttl_s=reads.stats_ttl_s,
        forgotten=reads.forgotten,
    )
    scorer = Scorer(
        resources.schema, resources.tables, metrics.observe_stage, reads.rows, videos=videos,
        fusion=Fusion.of(api.ranking_weights),
        reference_ttl_s=api.hot_row_cache_ttl_ms / 1000,
    )
    known = resources.families

    def loader(version: str) -> LoadedModel:
        """Load ``version`` against its family's tables (refused when they are not found)."""
        family = resources.registry.manifest(version).family
        tables = known.tables(family)
        if tables is None:
            raise ModelLoadError(
                f"version {version}: no sparse tables of family {family!r} found "
                f"(this server reads {settings.sparse.model_name!r} and the families "
                "registered or present in its sparse backend)"
            )
        return load_model(
            resources.registry,
            version,
            resources.schema,
            family,
            api,
            scorer.warm,
            reads.reader(tables),
            retrieval=settings.retrieval.enabled,
            ann=settings.ann,
            ann_dir=settings.data_dir / "ann" / family,
            retrieval_query=settings.retrieval.query,
        )

    holder = ModelHolder(
        resources.registry,
        loader,
        api.model_poll_interval_s,
        on_swap=lambda m: metrics.set_model(m.version, m.provider, m.warmup_seconds),
        on_failure=lambda version, exc: metrics.model_load_failures.inc(),
    )
    experiments = ExperimentStore(resources.registry.root)
    arms = ArmModels(
        experiments, resources.registry, holder, loader, api.model_poll_interval_s,
        metrics.registry,
    )
    retriever = Retriever(resources.catalog, signals, api, reads.videos)
    popular = PopularList(retriever, api.max_candidates, api.fallback_refresh_s)
    served_log = (
        ServedLogWriter(
            resources.served_log, settings.served_log, layout_of(resources.schema), metrics,
            feedback,
        )
        if resources.served_log is not None
        else None
    )
    summary = LogSummary(logging.getLogger("app.degraded"))
    recommender = Recommender(
        resources.activity,
        retriever,
        scorer,
        holder,
        popular,
        metrics,
        api,
        settings.limits.max_id_length,
        served_log=served_log,
        arms=arms,
        rerank=Reranker(settings.rerank, feedback),
        ids=RecommendationIds.for_key(api.admin_key.get_secret_value()),
        log_summary=summary,
        factors=resources.factors,
    )
    checkpoints = open_checkpoints(resources)
    with ExitStack() as stack:
        stack.callback(summary.close)
        scoring = ScoringThread()
        stack.callback(scoring.close)
        if served_log is not None:
            stack.enter_context(served_log)
        holder.start()
        stack.callback(holder.close)
        _start_configured(experiments, settings.experiments.configured)
        arms.start()
        stack.callback(arms.close)
        experiment_feed = None
        if settings.experiments.metrics_feed and resources.served_log is not None:
            assert checkpoints is not None
            experiment_feed = stack.enter_context(
                run_experiment_feed(resources, experiments, checkpoints)
            )
        feed = None
        if api.signal_feed:
            feed = stack.enter_context(run_signal_feed(resources, signals, feedback))
        popular.maybe_refresh()
        refresher = PopularRefresher(popular)
        refresher.start()
        stack.callback(refresher.close)
        in_process = None if trainer is None else stack.enter_context(trainer(resources, metrics))
        service = Service(
            resources=resources,
            reads=reads,
            signals=signals,
            feedback=feedback,
            metrics=metrics,
            scorer=scorer,
            holder=holder,
            retriever=retriever,
            popular=popular,
            recommender=recommender,
            validator=EventValidator(settings.limits),
            log_summary=summary,
            scoring=scoring,
            feed=feed,
            experiments=experiments,
            arms=arms,
            experiment_feed=experiment_feed,
            experiment_checkpoints=checkpoints,
            trainer=None if in_process is None else in_process.trainer,
            retrain=None if in_process is None else in_process.retrain,
        )
        for name, breaker in service.dependencies().items():
            metrics.dependency_up.labels(name).set_function(_up_of(breaker))
        model = holder.current
        log.info(
            "service ready to take requests: model %s on %s",
            model.version if model else None,
            model.provider if model else "-",
        )
        yield service


def _start_configured(store: ExperimentStore, specs: Sequence[ExperimentSpec]) -> None:
    """Start the experiments the settings define and the book lacks (``experiments.configured``)."""
    if not specs:
        return
    waiting = store.ensure(specs, "settings", int(time.time() * 1000))
    for experiment_id in waiting:
        log.warning(
            "configured experiment %s not started: another experiment is running", experiment_id
        )
