"""The replay: a dataset through the real trainer and service, and the baselines beside it.

One pass in event-time order over an embedded deployment (in-process event
log with one partition, so event time is log order; memory or Redis tables
and stores):

1. events are produced to the event log in chunks; the signal feed's step
   records them into the candidate signals and the online trainer
   (``vidrec.components:replay``) trains on them batch by batch, each
   batch scored *before* its step (prequential);
2. at each sampled held-back positive ``(user, video)`` of the last 20% of
   the stream, just before its first event is produced, the newest network
   is exported (when ``export_every`` events were trained since the last
   export), hot-swapped into the service, and the service's ``recommend``
   is asked for the user's top ``k`` with its clock at the event's time;
   the video's rank gives recall@k and NDCG@k.

Then, on the very samples the trainer labelled (weight > 0):

- global popularity and recent (decayed) popularity score each one before
  counting it, and answer the same ranking queries at the same moments,
  excluding the same already-watched videos the service excluded;
- Wide&Deep trained offline (``vidrec.components:offline``) on the first 80%
  by (ts, user, video), early-stopped on its last eighth, scores the last 20%.

Every model's AUC "on the last 20%" is over exactly the same rows.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from app.evaluation import baselines
from app.evaluation.metrics import rank_of, recall_ndcg, windowed_auc, windows
from app.evaluation.progress import Progress
from app.evaluation.stream import (
    Format,
    Split,
    Stream,
    load_stream,
    rating_label_settings,
    split_samples,
)
from app.schemas import RecommendRequest
from app.service import open_service
from app.signal_feed import POLL_RECORDS, SignalFeed, feed_group
from feature_store.component import (
    OFFLINE_ENTRY_POINT,
    REPLAY_ENTRY_POINT,
    OfflineResult,
    ReplayHandle,
    ScoredSamples,
    load_component,
)
from feature_store.errors import ConfigurationError
from feature_store.events import Event, EventContext, EventType
from feature_store.quality import log_loss, roc_auc
from feature_store.runtime import Resources, open_resources
from feature_store.settings import Settings

log = logging.getLogger(__name__)

_CHUNK = 4096
"""Events produced to the log between two drains of the trainer."""
_DAY_MS = 86_400_000


@dataclass
class EvalConfig:
    """What ``vidrec eval`` runs; every default is what ``docs/benchmarks.md`` records."""

    dataset: Path
    fmt: Format = "auto"
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    """Scratch Redis database for ``backend="redis"`` (must be empty: the eval writes there)."""
    batch_size: int = 32
    """Events per online training step (about 11 MovieLens ratings).

    Chosen on the first 80% only (prequential AUC there, ml-100k): 256
    events 0.723, 128 0.735, 64 0.746, 32 0.752, 16 0.756 at 2.5x the time
    of 32. The production trainer's default (1024) trades this for
    throughput; here each user's first ratings matter most."""
    queries: int = 500
    """Held-back positives asked of the live service (sampled from the last 20%)."""
    k: int = 20
    windows: int = 20
    """Equal-count time windows of the per-window AUC."""
    export_every: int = 5000
    """Events trained between exports to the service (checked before each query)."""
    half_life_days: float = 7.0
    """Half-life of the recent-popularity baseline, days of event time."""
    user_attributes: bool = True
    """Use the users' age group, gender and occupation where the data has them."""
    offline_epochs: int = 10
    patience: int = 2
    seed: int = 0
    limit: int | None = None
    """At most this many events (quick runs)."""
    progress: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    """Extra settings sections merged over the evaluation's (e.g. ``{"sparse": {...}}``)."""


@dataclass
class Query:
    user: str
    video: str
    position: int
    """Index of the pair's first event; asked before it is produced."""
    ts: int
    before: int = 0
    """Weighted samples trained before the question."""
    seen: frozenset[str] = frozenset()
    rank: int | None = None
    fallback: str | None = None


@dataclass
class ModelFigures:
    name: str
    auc_test: float
    logloss_test: float
    auc_all: float = math.nan
    logloss_all: float = math.nan
    recall: float = math.nan
    ndcg: float = math.nan
    window_auc: list[float] = field(default_factory=list)
    auc_fit: float = math.nan
    """AUC on the first 80% (train + validation rows): what settings may be tuned on."""


@dataclass
class EvalResult:
    dataset: str
    events: int
    samples: int
    test_rows: int
    positive_rate: float
    new_test_users: float
    """Share of test users with no row in the training part (train + validation)."""
    new_test_rows: float
    """Share of test rows whose user has no row in the training part."""
    models: list[ModelFigures]
    window_ends_ms: list[int]
    test_start_ms: int
    offline_epochs: list[dict[str, float]]
    offline_best_epoch: int
    queries: int
    service_candidate_recall: float
    """Share of queries whose item was among the service's candidates (any rank)."""
    service_fallbacks: dict[str, int]
    user_attributes: bool
    """The users' age group, gender and occupation were features."""
    seconds: float
    online_seconds: float
    events_per_s: float

    def model(self, name: str) -> ModelFigures:
        return next(m for m in self.models if m.name == name)


def eval_settings(
    cfg: EvalConfig, data_dir: Path, kind: str, backend: str, user_attributes: bool = False
) -> Settings:
    features = {"user_attributes": user_attributes and cfg.user_attributes}
    trainer: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "export_every_s": 0,
        "checkpoint_every_s": 1e9,
        "seed": cfg.seed,
        "dedupe_window": 0,
    }
    if kind == "movielens":
        trainer.update(rating_label_settings())
    sections: dict[str, Any] = {
        "data_dir": data_dir,
        "event_log": {"backend": "memory", "memory_partitions": 1,
                      "memory_retention_records": 100_000_000},
        "trainer": trainer,
        "features": features,
        # The service's ONNX session on CPU: the figures are quality, not speed.
        "api": {"signal_feed": False, "model_poll_interval_s": 3600, "onnx_provider": "cpu"},
        "sparse": {"backend": backend, "model_name": f"eval{int(time.time())}"},
        "stores": {"backend": backend},
    }
    if backend == "redis":
        if not cfg.redis_url:
            raise ConfigurationError("eval --redis needs the URL of a scratch database")
        sections["redis"] = {"url": cfg.redis_url}
    for name, values in cfg.settings.items():
        sections[name] = {**sections.get(name, {}), **values}
    return Settings(**sections)


def _strong_positive(event: Event) -> bool:
    if event.type in (EventType.FINISH, EventType.LIKE, EventType.SHARE):
        return True
    ratio = event.watch_ratio() if event.type == EventType.PLAY else None
    return ratio is not None and ratio >= 0.5


def pick_queries(events: Sequence[Event], count: int, seed: int) -> list[Query]:
    """Sampled first positives of ``(user, video)`` pairs in the last 20% of the events."""
    first: dict[tuple[str, str], int] = {}
    for i, e in enumerate(events):
        first.setdefault((e.user_id, e.video_id), i)
    start = int(len(events) * 0.8)
    pairs: dict[tuple[str, str], int] = {}
    for e in events[start:]:
        pair = (e.user_id, e.video_id)
        if pair not in pairs and first[pair] >= start and _strong_positive(e):
            pairs[pair] = first[pair]
    rng = np.random.default_rng(seed)
    chosen = sorted(pairs.items(), key=lambda kv: kv[1])
    if len(chosen) > count:
        picks = np.sort(rng.choice(len(chosen), size=count, replace=False))
        chosen = [chosen[i] for i in picks.tolist()]
    return [Query(u, v, pos, events[pos].ts) for (u, v), pos in chosen]


class _Online:
    """The first pass (see the module doc): trainer, signal feed and service."""

    def __init__(self, cfg: EvalConfig, stream: Stream, resources: Resources) -> None:
        self.cfg = cfg
        self.events = stream.events
        self.users = stream.users
        self.resources = resources
        self.parts: list[ScoredSamples] = []
        self.weighted = 0
        self.position = 0
        self.since_export = math.inf
        self.fallbacks: dict[str, int] = {}
        self.progress = Progress(len(stream.events), "replay", "events", enabled=cfg.progress)

    def run(self, queries: list[Query]) -> ScoredSamples:
        resources = self.resources
        with open_service(resources) as service:
            self.now_s = 0.0
            service.recommender.clock = lambda: self.now_s
            replay: ReplayHandle = load_component(REPLAY_ENTRY_POINT)(resources)
            feed = SignalFeed(resources, service.signals)
            consumer = resources.event_log.consumer(feed_group(resources))
            try:
                for query in queries:
                    self._advance(query.position, replay, feed, consumer)
                    if self.since_export >= self.cfg.export_every:
                        replay.export()
                        service.holder.poll_once()
                        self.since_export = 0
                    self._ask(service, query)
                self._advance(len(self.events), replay, feed, consumer)
            finally:
                consumer.close()
                replay.close()
                self.progress.close()
        return ScoredSamples.concat(self.parts)

    def _advance(self, target: int, replay: ReplayHandle, feed: SignalFeed, consumer: Any) -> None:
        while self.position < target:
            end = min(target, self.position + _CHUNK)
            self.resources.event_log.produce(self.events[self.position : end])
            while feed.step(consumer) == POLL_RECORDS:
                pass
            scored = replay.drain()
            self.parts.append(scored)
            self.weighted += int((scored.weights > 0).sum())
            self.since_export += end - self.position
            self.progress.update(end - self.position)
            self.position = end

    def _ask(self, service: Any, query: Query) -> None:
        self.now_s = query.ts / 1000.0
        # Every candidate, ranked: the top k are the answer to a request for k, and
        # the rest tell whether the item was retrieved at all.
        everything = self.resources.settings.api.max_candidates
        response = service.recommender.recommend(RecommendRequest(
            user_id=query.user, count=everything,
            context=self.users.get(query.user, EventContext()),
        ))
        query.rank = rank_of(query.video, [item.video_id for item in response.items])
        query.seen = frozenset(h.video_id for h in self.resources.activity.history(query.user))
        query.before = self.weighted
        query.fallback = response.fallback_reason
        if query.fallback:
            self.fallbacks[query.fallback] = self.fallbacks.get(query.fallback, 0) + 1


def _offline(
    cfg: EvalConfig, stream: Stream, split: Split, root: Path
) -> OfflineResult:
    """Wide&Deep in epochs, on fresh in-process tables and stores (a batch job's setup)."""
    settings = eval_settings(cfg, root / "offline", stream.kind, "memory", bool(stream.users))
    train: Callable[..., OfflineResult] = load_component(OFFLINE_ENTRY_POINT)
    with open_resources(settings) as resources:
        if stream.videos:
            resources.catalog.upsert(stream.videos)
        return train(
            resources, stream.events, split.train, split.valid, split.test,
            max_epochs=cfg.offline_epochs, patience=cfg.patience, seed=cfg.seed,
        )


def _baseline(
    name: str,
    model: baselines.Popularity,
    weighted: ScoredSamples,
    queries: list[Query],
    k: int,
) -> tuple[np.ndarray, list[int | None]]:
    stops: dict[int, list[int]] = {}
    for qi, q in enumerate(queries):
        stops.setdefault(q.before, []).append(qi)
    ranks: list[int | None] = [None] * len(queries)

    def answer(qi: int) -> None:
        q = queries[qi]
        ranks[qi] = rank_of(q.video, model.top(k, q.ts, q.seen))

    scores = baselines.prequential(
        model, weighted.video_ids, weighted.ts_ms.tolist(), weighted.labels, stops, answer
    )
    log.info("%s: scored %d samples", name, len(scores))
    return scores, ranks


def _figures(
    name: str,
    scores: np.ndarray,
    weighted: ScoredSamples,
    test_idx: np.ndarray,
    slices: list[tuple[int, int]],
    ranks: list[int | None] | None,
    k: int,
) -> ModelFigures:
    labels = weighted.labels
    recall, ndcg = recall_ndcg(ranks, k) if ranks is not None else (math.nan, math.nan)
    fit = np.setdiff1d(np.arange(len(labels)), test_idx)
    return ModelFigures(
        auc_fit=roc_auc(scores[fit], labels[fit]),
        name=name,
        auc_test=roc_auc(scores[test_idx], labels[test_idx]),
        logloss_test=log_loss(scores[test_idx], labels[test_idx]),
        auc_all=roc_auc(scores, labels),
        logloss_all=log_loss(scores, labels),
        recall=recall,
        ndcg=ndcg,
        window_auc=windowed_auc(scores, labels, slices),
    )


def evaluate(cfg: EvalConfig) -> EvalResult:
    """Run the whole evaluation (see the module doc); nothing is written but temp files."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidrec-eval-") as tmp:
        root = Path(tmp)
        probe = Settings(data_dir=root / "probe")
        stream = load_stream(cfg.dataset, cfg.fmt, probe.limits.min_ts_ms, cfg.limit)
        if not stream.events:
            raise ConfigurationError(f"{cfg.dataset}: no events")
        queries = pick_queries(stream.events, cfg.queries, cfg.seed)
        settings = eval_settings(
            cfg, root / "online", stream.kind, cfg.backend, bool(stream.users)
        )
        with open_resources(settings) as resources:
            if cfg.backend == "redis" and resources.redis_client is not None:
                _check_scratch(resources)
            if stream.videos:
                resources.catalog.upsert(stream.videos)
            online = _Online(cfg, stream, resources)
            t0 = time.perf_counter()
            samples = online.run(queries)
            online_seconds = time.perf_counter() - t0
            if cfg.backend == "redis" and resources.redis_client is not None:
                resources.redis_client.flushdb()
        weighted = samples.take(np.flatnonzero(samples.weights > 0).tolist())
        split = split_samples(weighted)
        offline = _offline(cfg, stream, split, root)
    return _result(cfg, stream, weighted, split, offline, queries, online, online_seconds, started)


def _check_scratch(resources: Resources) -> None:
    client = resources.redis_client
    assert client is not None
    keys = client.dbsize()
    if keys:
        raise ConfigurationError(
            f"eval --redis: the database holds {keys} keys; give an empty scratch database "
            "(the evaluation writes a catalog, activity and tables there and flushes it after)"
        )


def _result(
    cfg: EvalConfig,
    stream: Stream,
    weighted: ScoredSamples,
    split: Split,
    offline: OfflineResult,
    queries: list[Query],
    online: _Online,
    online_seconds: float,
    started: float,
) -> EvalResult:
    index = {eid: i for i, eid in enumerate(weighted.event_ids)}
    test_idx = np.array([index[e] for e in split.test], dtype=np.int64)
    slices = windows(len(weighted.event_ids), cfg.windows)
    online_ranks = [q.rank for q in queries]
    models = [_figures("online Wide&Deep", weighted.scores, weighted, test_idx, slices,
                       online_ranks, cfg.k)]
    for name, model in (
        ("popularity", baselines.Popularity()),
        (f"recent popularity ({cfg.half_life_days:g} d)",
         baselines.Popularity(cfg.half_life_days * _DAY_MS)),
    ):
        scores, ranks = _baseline(name, model, weighted, queries, cfg.k)
        models.append(_figures(name, scores, weighted, test_idx, slices, ranks, cfg.k))
    off_scores = np.full(len(weighted.event_ids), np.nan)
    for eid, score in zip(offline.test.event_ids, offline.test.scores, strict=True):
        off_scores[index[eid]] = score
    labels = weighted.labels
    models.append(ModelFigures(
        name=f"offline Wide&Deep (epoch {offline.best_epoch})",
        auc_test=roc_auc(off_scores[test_idx], labels[test_idx]),
        logloss_test=log_loss(off_scores[test_idx], labels[test_idx]),
        window_auc=[
            math.nan if np.isnan(off_scores[a:b]).any() else roc_auc(off_scores[a:b], labels[a:b])
            for a, b in slices
        ],
    ))
    fit_users = {weighted.user_ids[index[e]] for e in (*split.train, *split.valid)}
    test_user_rows = [weighted.user_ids[i] for i in test_idx.tolist()]
    test_users = set(test_user_rows)
    return EvalResult(
        dataset=str(cfg.dataset),
        events=len(stream.events),
        samples=len(weighted.event_ids),
        test_rows=len(test_idx),
        positive_rate=float(labels.mean()) if len(labels) else math.nan,
        new_test_users=len(test_users - fit_users) / max(1, len(test_users)),
        new_test_rows=sum(u not in fit_users for u in test_user_rows) / max(1, len(test_user_rows)),
        models=models,
        window_ends_ms=[int(weighted.ts_ms[b - 1]) for _, b in slices],
        test_start_ms=split.test_start_ts,
        offline_epochs=offline.epochs,
        offline_best_epoch=offline.best_epoch,
        queries=len(queries),
        service_candidate_recall=(
            sum(q.rank is not None for q in queries) / len(queries) if queries else math.nan
        ),
        service_fallbacks=online.fallbacks,
        user_attributes=bool(stream.users) and cfg.user_attributes,
        seconds=time.perf_counter() - started,
        online_seconds=online_seconds,
        events_per_s=len(stream.events) / max(online_seconds, 1e-9),
    )
