"""The replay: a dataset through the real trainer and service, and the baselines beside it.

One pass in event-time order over an embedded deployment (in-process event
log with one partition, so event time is log order; memory or Redis tables
and stores):

1. events are produced to the event log in chunks; the signal feed's step
   records them into the candidate signals and the online trainer
   (``trainer.offline.OnlineReplay``, handed in by ``app.wiring``) trains on
   them batch by batch, each batch scored *before* its step (prequential);
   both are exact to each question's moment (a question cuts the trainer's
   batch short there);
2. at each query, before any event at or after its moment is produced, the
   newest network is exported (when ``export_every`` events were trained
   since the last export), hot-swapped into the service, and the service's
   ``recommend`` is asked with its clock at the moment. Two protocols:

   - ``retrieval``: queries are sampled held-back positives ``(user, video)``
     of the last 20% of the stream; the service retrieves and ranks its own
     candidates, and the video's rank gives recall@k and NDCG@k. Needs the
     videos' catalog (without one nothing can be retrieved: not computed);
   - ``loo`` (leave-one-out, :mod:`~app.evaluation.feed`): every user's last
     view is held out of the log; the service ranks it among 99 sampled
     videos the user never touched (``candidates=`` in the request), giving
     HR@k and NDCG@k (k = 10). With ``full_ranking`` it ranks it against
     the whole catalog instead, minus the videos the user viewed before (the
     user's training items, as published sequential-recommendation results
     count it); the log replayed is the same.

   Each answer gives two ranks: the final ranking's (the model's
   probability fused with the retrieval and co-visitation bonus,
   :mod:`app.scoring.ranking`, after the rerank) and the ranker's alone
   (the same candidates ordered by the model's probability only).

Then, on the very samples the trainer labelled (weight > 0):

- global popularity and recent (decayed) popularity score each one before
  counting it, and answer the same ranking queries at the same moments
  (retrieval: excluding the already-watched videos the service excluded;
  loo: ranking the same candidates); under ``loo`` item co-occurrence ranks
  them too (:class:`~app.evaluation.baselines.CoOccurrence`); so does
  matrix factorisation (:mod:`~app.evaluation.factorization`, when
  ``implicit`` is installed), trained on the positive samples before each
  question only;
- Wide&Deep trained offline (``trainer.offline.train_offline``) on the first 80%
  by (ts, user, video), early-stopped on its last eighth, scores the last 20%.

Every model's AUC "on the last 20%" is over exactly the same rows, per
sample and per moment (:func:`~app.evaluation.metrics.moments`).

Cost (``docs/evaluation.md``): exports are scheduled by
event count (``export_every`` events trained, checked at each question), never
by wall time; nothing of the temporary deployment is persisted (event log,
signal snapshots, served log); from :data:`PARALLEL_FROM_EVENTS` events the
offline model trains in a second process while this one computes the
baselines.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import multiprocessing
import tempfile
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, runtime_checkable

import numpy as np

from app.cold_start import ColdStart
from app.evaluation import factorization
from app.evaluation.factorization import AlsParams, RanksAhead
from app.evaluation.feed import (
    HeldOut,
    Sampler,
    as_feed,
    check_positive_only,
    hold_out_last,
    touched_by_user,
)
from app.evaluation.metrics import rank_in, rank_of
from app.evaluation.progress import Progress
from app.evaluation.results import EvalResult, Timing, assemble
from app.evaluation.stream import (
    Format,
    Split,
    Stream,
    id_only_videos,
    load_stream,
    rating_label_settings,
    split_samples,
)
from app.schemas import RecommendRequest
from app.service import open_service
from app.signal_feed import POLL_RECORDS, SignalFeed, feed_group
from feature_store.errors import ConfigurationError
from feature_store.event_types import valued
from feature_store.events import Event, EventContext
from feature_store.models.scored import OfflineResult, ScoredSamples
from feature_store.runtime.resources import Resources, open_resources
from feature_store.settings import ApiSettings, Settings

log = logging.getLogger(__name__)


@runtime_checkable
class ReplayHandle(typing.Protocol):  # ``Protocol`` here names the eval protocols
    """The online trainer consuming the event log in the caller's thread."""

    def drain(self, now_ms: int | None = None) -> ScoredSamples:
        """Train on every event produced so far, then resolve (as an idle stream does) the
        impressions older than the join window at ``now_ms``, event time (default: the
        newest event's); the samples trained, scored before training."""
        ...

    def export(self) -> str:
        """Export and activate the current network; returns the version."""
        ...

    def heads(self) -> dict[str, float]:
        """The other ranking heads' prequential figures over the trainer's window, with
        their popularity baselines (``negative_auc``, ``watch_spearman``...: see
        ``trainer/metrics.py``)."""
        ...

    def close(self) -> None: ...


ReplayFactory = Callable[[Resources], ReplayHandle]
OfflineTrainer = Callable[..., OfflineResult]
"""``(resources, events, train_ids, valid_ids, test_ids, *, max_epochs, patience, seed)``."""


@dataclass(frozen=True)
class EvalTrainers:
    """The trainers an evaluation runs, handed in by the composition root (``app.wiring``)
    so that this package never imports ``trainer``."""

    replay: ReplayFactory
    """The online trainer, driven batch by batch beside the service (first pass)."""
    offline: OfflineTrainer
    """Wide&Deep trained in epochs on the first 80% (the offline reference)."""

HEAD_WINDOW = 200_000
"""Samples per head over which the report's head figures are computed (the trainer's
``metrics_window`` in an evaluation; about 10 MB of rings)."""
_CHUNK = 4096
"""Events produced to the log between two drains of the trainer."""
_DAY_MS = 86_400_000
Protocol = Literal["retrieval", "loo"]
MAX_FULL_RANKING = 10_000
"""Most videos ``full_ranking`` ranks per question: one request's ``api.max_candidates``
at most (its settings' ceiling)."""


@dataclass
class EvalConfig:
    """What ``vidrec eval`` runs; every default is what ``docs/benchmarks.md`` records."""

    dataset: Path
    fmt: Format = "auto"
    protocol: Protocol = "retrieval"
    negatives: int = 0
    """Unwatched impressions added per view of a positive-only log (0: the log as is)."""
    catalog: Path | None = None
    """Videos of a CSV / Parquet dataset (CSV, JSON lines or Parquet)."""
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    """Scratch Redis database for ``backend="redis"`` (must be empty: the eval writes there)."""
    batch_size: int = 32
    """Events per online training step (about 11 MovieLens ratings).

    Chosen on the first 80% only (prequential AUC there, ml-100k): 256
    events 0.723, 128 0.735, 64 0.746, 32 0.752, 16 0.756 at 2.5x the time
    of 32. The production trainer's default (1024) trades this for
    throughput; here each user's first ratings matter most."""
    queries: int | None = None
    """Retrieval: held-back positives asked of the service (sampled from the last 20%;
    None: 500). Leave-one-out: users held out (None: every user with two views)."""
    k: int | None = None
    """Cut-off of the ranking figures (None: 20 for retrieval, 10 for leave-one-out)."""
    candidates: int = 99
    """Leave-one-out: sampled videos ranked beside the held-out one."""
    full_ranking: bool = False
    """Leave-one-out: rank the held-out video against the whole catalog minus the user's
    earlier views instead of ``candidates`` sampled ones (the log replayed is the same)."""
    mf: AlsParams = field(default_factory=AlsParams)
    """The matrix-factorisation baseline's settings (:mod:`~app.evaluation.factorization`)."""
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
    parallel: bool | None = None
    """Train the offline model in a second process while the baselines are computed
    (None: when the replay has :data:`PARALLEL_FROM_EVENTS` events or more)."""
    progress: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    """Extra settings sections merged over the evaluation's (e.g. ``{"sparse": {...}}``)."""

    @property
    def cutoff(self) -> int:
        return self.k if self.k is not None else (10 if self.protocol == "loo" else 20)

    @property
    def implicit(self) -> bool:
        """The dataset is read as a positive-only log (MovieLens: every rating a view)."""
        return self.protocol == "loo" or self.negatives > 0


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
    candidates: tuple[str, ...] = ()
    """Leave-one-out: the videos to rank (the held-out one among them); empty: retrieval."""
    rank: int | None = None
    pool_rank: int | None = None
    """The item's rank in the service's candidate pool in its sources' interleave order
    (before the model ranked it; None: not in the pool, or no model-ranked answer)."""
    ranker_rank: int | None = None
    """The item's rank in that pool by the model's probability alone (no bonus, no rerank;
    None likewise)."""
    sequence_rank: int | None = None
    """The item's rank in that pool by the served sequence tower's logit alone (the pool's
    order for a user without a view it knows; None: no tower, or not in the pool)."""
    fallback: str | None = None


def eval_settings(
    cfg: EvalConfig, data_dir: Path, kind: str, backend: str, user_attributes: bool = False,
    catalog_size: int = 0,
) -> Settings:
    """The evaluation's settings; ``catalog_size``: videos one full-ranking question asks
    the service to rank (its candidate and count caps are raised to it)."""
    features: dict[str, Any] = {"user_attributes": user_attributes and cfg.user_attributes}
    trainer: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "export_every_s": 0,
        "checkpoint_every_s": 1e9,
        "seed": cfg.seed,
        "dedupe_window": 0,
        # The heads' figures in the report are over this window of each head's samples:
        # the whole of ml-100k, the last HEAD_WINDOW of a longer stream.
        "metrics_window": HEAD_WINDOW,
    }
    if kind == "movielens" and not cfg.implicit:  # implicit: every rating a finish, weight 1
        labels = rating_label_settings()
        trainer.update(labels["trainer"])
        features.update(labels["features"])
    sections: dict[str, Any] = {
        "data_dir": data_dir,
        # Nothing is persisted: the replay dies with its temp directory.
        "event_log": {"backend": "memory", "memory_partitions": 1,
                      "memory_retention_records": 100_000_000, "memory_persist": False},
        # Events carry no recommendation ids: no served row would ever be joined.
        "served_log": {"enabled": False},
        # Refits at the exports that find them due: reproducible and point in time.
        "sequence": {"background": False},
        "trainer": trainer,
        "features": features,
        # The service's ONNX session on CPU: the figures are quality, not speed. Nothing
        # reused by wall time (read caches, kept anonymous scores): a question reads the
        # state of its moment in the replay, however fast the machine replays.
        "api": {"signal_feed": False, "model_poll_interval_s": 3600, "onnx_provider": "cpu",
                "hot_row_cache_ttl_ms": 0, **_full_ranking_caps(cfg, catalog_size)},
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


def _full_ranking_caps(cfg: EvalConfig, catalog_size: int) -> dict[str, Any]:
    """The API caps one full-ranking request needs: every video a candidate, all returned."""
    if not cfg.full_ranking:
        return {}
    if catalog_size > MAX_FULL_RANKING:
        raise ConfigurationError(
            f"--full-ranking ranks at most {MAX_FULL_RANKING:,} videos per question (one "
            f"request); the catalog has {catalog_size:,}: use the sampled protocol"
        )
    caps = ApiSettings()
    size = max(catalog_size, caps.max_candidates)
    buckets = tuple(b for b in caps.batch_buckets if b < size) + (size,)
    return {"max_candidates": size, "max_count": max(size, caps.max_count),
            "batch_buckets": buckets}


def _strong_positive(event: Event) -> bool:
    """A positive verdict, or a watch judged valued (at the default 0.5 ratio)."""
    return valued(event.type, event.watch_ratio(), 0.5, 0.0) is True


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

    def __init__(
        self, cfg: EvalConfig, stream: Stream, resources: Resources, replay: ReplayFactory,
        baselines: bool = False,
    ) -> None:
        """``baselines``: work out the matrix-factorisation baseline's ranks beside the
        replay where :func:`_parallel` says so (``evaluate``; a replay alone, such as
        ``bench/screen_loo.py``, has no use for them)."""
        self.cfg = cfg
        self.baselines = baselines
        self.replay_factory = replay
        self.events = stream.events
        self.users = stream.users
        self.resources = resources
        self.parts: list[ScoredSamples] = []
        self.weighted = 0
        self.position = 0
        self.since_export = math.inf
        self.fallbacks: dict[str, int] = {}
        self.heads: dict[str, float] = {}
        """The other heads' prequential figures at the end of the replay."""
        self.mf_ahead: RanksAhead | None = None
        self.mf_ranks: list[int] | None = None
        """The matrix-factorisation baseline's ranks, worked out beside the replay (loo on a
        long replay: :func:`_parallel`); None: computed after it."""
        self.progress = Progress(len(stream.events), "replay", "events", enabled=cfg.progress)

    def run(self, queries: list[Query]) -> ScoredSamples:
        resources = self.resources
        with open_service(resources) as service:
            self.now_s = 0.0
            service.recommender.clock = lambda: self.now_s
            if service.recommender.rerank is not None:
                # Exploration draws seeded, cold-start rates refreshed on event time: the
                # answers do not depend on the machine's speed or on the run.
                service.recommender.rerank.cold_start = ColdStart(
                    resources.settings.rerank, seed=self.cfg.seed, clock=lambda: self.now_s
                )
            replay = self.replay_factory(resources)
            feed = SignalFeed(resources, service.signals, service.feedback, snapshots=False)
            consumer = resources.event_log.consumer(feed_group(resources))
            try:
                if (self.baselines and queries and queries[0].candidates
                        and factorization.available() and _parallel(self.cfg, len(self.events))):
                    self.mf_ahead = RanksAhead(self.cfg.mf, self.cfg.seed)
                for query in queries:
                    self._advance(query.position, replay, feed, consumer)
                    if self.since_export >= self.cfg.export_every:
                        replay.export()
                        service.holder.poll_once()
                        self.since_export = 0
                    self._ask(service, query)
                self._advance(len(self.events), replay, feed, consumer)
                self._finish(replay)
                self.heads = replay.heads()
                if self.mf_ahead is not None:
                    self.mf_ranks = self.mf_ahead.ranks()
            finally:
                consumer.close()
                replay.close()
                self.progress.close()
                if self.mf_ahead is not None:
                    self.mf_ahead.close()
        return ScoredSamples.concat(self.parts)

    def _advance(self, target: int, replay: ReplayHandle, feed: SignalFeed, consumer: Any) -> None:
        while self.position < target:
            end = min(target, self.position + _CHUNK)
            self.resources.event_log.produce(self.events[self.position : end])
            while feed.step(consumer) == POLL_RECORDS:
                pass
            scored = replay.drain()
            self._trained(scored)
            self.since_export += end - self.position
            self.progress.update(end - self.position)
            self.position = end

    def _finish(self, replay: ReplayHandle) -> None:
        """The end of the stream: the impressions still waiting for a response time out
        (an idle spell of one join window), and train, as they would online."""
        if not self.events:
            return
        window_ms = self.resources.settings.trainer.join_window_ms
        self._trained(replay.drain(now_ms=self.events[-1].ts + window_ms + 1))

    def _trained(self, scored: ScoredSamples) -> None:
        self.parts.append(scored)
        weighted = scored.weights > 0
        self.weighted += int(weighted.sum())
        if self.mf_ahead is not None:  # the baseline's pairs: positive weighted samples
            self.mf_ahead.add(scored.user_ids, scored.video_ids, weighted & (scored.labels > 0.5))

    def _ask(self, service: Any, query: Query) -> None:
        self.now_s = query.ts / 1000.0
        context = self.users.get(query.user, EventContext())
        if query.candidates:
            # The protocol fixes the candidates: the held-out video is scored even if
            # the user saw it before (a re-watch), and every candidate comes back ranked.
            request = RecommendRequest(
                user_id=query.user, count=len(query.candidates),
                candidates=list(query.candidates), exclude_seen=False, context=context,
            )
        else:
            # Every candidate, ranked: the top k are the answer to a request for k, and
            # the rest tell whether the item was retrieved at all.
            request = RecommendRequest(
                user_id=query.user, count=self.resources.settings.api.max_candidates,
                context=context,
            )
        pool: list[str] = []
        probability: list[float] = []

        def observe(user: str, ids: Sequence[str], sources: Sequence[str],
                    scores: np.ndarray) -> None:
            pool.extend(ids)
            probability.extend(np.asarray(scores, dtype=np.float64).tolist())

        service.recommender.pool_observer = observe
        try:
            response = service.recommender.recommend(request)
        finally:
            service.recommender.pool_observer = None
        query.rank = rank_of(query.video, [item.video_id for item in response.items])
        query.pool_rank = rank_of(query.video, pool)
        if query.pool_rank is not None:  # ties keep the pool's order (random under loo)
            query.ranker_rank = rank_in(query.video, pool, np.asarray(probability))
            query.sequence_rank = _sequence_rank(service, query, pool)
        query.seen = frozenset(h.video_id for h in self.resources.activity.history(query.user))
        query.before = self.weighted
        if self.mf_ahead is not None:
            self.mf_ahead.ask(query.before, query.user, query.video, query.candidates)
        query.fallback = response.fallback_reason
        if query.fallback:
            self.fallbacks[query.fallback] = self.fallbacks.get(query.fallback, 0) + 1


def _sequence_rank(service: Any, query: Query, pool: list[str]) -> int | None:
    """``query``'s video's rank in ``pool`` by the served sequence tower alone."""
    model = service.recommender.holder.current
    if model is None or model.sequence is None:
        return None
    logits = model.sequence.logits(service.recommender.activity.history(query.user), pool)
    return rank_in(query.video, pool, np.zeros(len(pool)) if logits is None else logits)


def _offline(
    cfg: EvalConfig, stream: Stream, split: Split, root: Path, train: OfflineTrainer
) -> OfflineResult:
    """Wide&Deep in epochs, on fresh in-process tables and stores (a batch job's setup)."""
    settings = eval_settings(cfg, root / "offline", stream.kind, "memory", bool(stream.users))
    with open_resources(settings) as resources:
        if stream.videos:
            resources.catalog.upsert(stream.videos)
        return train(
            resources, stream.events, split.train, split.valid, split.test,
            max_epochs=cfg.offline_epochs, patience=cfg.patience, seed=cfg.seed,
        )


def plan(cfg: EvalConfig, stream: Stream, settings: Settings) -> list[Query]:
    """The protocol applied to ``stream`` (its events become those replayed) and its queries.

    Positive-only reading (``loo`` or ``negatives``): the log is checked to be
    one, users' last views are held out (``loo``) and impressions are added
    (``negatives``); see :mod:`app.evaluation.feed`.
    """
    follow_up = settings.trainer.join_window_ms
    if cfg.implicit:
        what = "--protocol loo" if cfg.protocol == "loo" else "--negatives"
        check_positive_only(stream.events, what)
    if cfg.protocol == "loo" and not stream.videos:
        stream.videos = id_only_videos(stream.events)
    pool = [v.video_id for v in stream.videos if not v.hidden] or sorted(
        {e.video_id for e in stream.events})
    sampler = Sampler(pool, cfg.seed)
    touched = touched_by_user(stream.events)  # the whole log, held-out views included
    events = stream.events
    held: list[HeldOut] = []
    if cfg.protocol == "loo":
        events, held = hold_out_last(events, follow_up, sampler, cfg.candidates, cfg.queries)
    if cfg.negatives:
        events = as_feed(events, cfg.negatives, sampler, touched, follow_up,
                         settings.limits.max_id_length)
    stream.events = events
    if cfg.full_ranking:
        held = whole_catalog(held, pool, touched, cfg.seed)
    if cfg.protocol == "loo":
        times = [e.ts for e in events]
        return [
            Query(h.user, h.video, bisect.bisect_left(times, h.ts), h.ts,
                  candidates=h.candidates)
            for h in held
        ]
    if not stream.catalog:
        return []  # nothing to retrieve from: the report says so
    return pick_queries(events, cfg.queries if cfg.queries is not None else 500, cfg.seed)


def whole_catalog(
    held: list[HeldOut], pool: Sequence[str], touched: dict[str, set[str]], seed: int
) -> list[HeldOut]:
    """Each held-out view to be ranked against every video of ``pool`` but the user's
    training items (what they touched, held-out video aside), in a seeded random order.

    A sampler of its own (not the feed's), so that the log replayed is the same as the
    sampled protocol's with the same seed.
    """
    order = Sampler(pool, seed + 1)
    return [
        replace(h, candidates=order.shuffled(
            [h.video, *(v for v in order.pool if v != h.video and v not in touched[h.user])]
        ))
        for h in held
    ]


def prepare(cfg: EvalConfig, root: Path, announce: bool = True
            ) -> tuple[Stream, Settings, list[Query]]:
    """The dataset read, the online run's settings (data under ``root``) and the protocol
    applied (:func:`plan`); ``announce``: log what was skipped or shifted."""
    probe = Settings(data_dir=root / "probe")
    stream = load_stream(cfg.dataset, cfg.fmt, probe.limits, cfg.limit, cfg.catalog,
                         cfg.implicit)
    if not stream.events:
        raise ConfigurationError(f"{cfg.dataset}: no events")
    if stream.rejected.count and announce:
        log.warning("%s: %s", cfg.dataset, stream.rejected.describe())
    if stream.shift_ms and announce:
        log.log(logging.INFO if stream.kind == "movielens" else logging.WARNING,
                "%s: every timestamp shifted by %+.1f days (the first was before "
                "limits.min_ts_ms)", cfg.dataset, stream.shift_ms / _DAY_MS)
    catalog_size = len(stream.videos) or len({e.video_id for e in stream.events})
    settings = eval_settings(
        cfg, root / "online", stream.kind, cfg.backend, bool(stream.users), catalog_size
    )
    return stream, settings, plan(cfg, stream, settings)


def evaluate(cfg: EvalConfig, trainers: EvalTrainers) -> EvalResult:
    """Run the whole evaluation (see the module doc) with ``trainers``; nothing is written
    but temp files."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidrec-eval-") as tmp:
        root = Path(tmp)
        stream, settings, queries = prepare(cfg, root)
        with open_resources(settings) as resources:
            if cfg.backend == "redis" and resources.redis_client is not None:
                _check_scratch(resources)
            if stream.videos:
                resources.catalog.upsert(stream.videos)
            online = _Online(cfg, stream, resources, trainers.replay, baselines=True)
            t0 = time.perf_counter()
            samples = online.run(queries)
            online_seconds = time.perf_counter() - t0
            if cfg.backend == "redis" and resources.redis_client is not None:
                resources.redis_client.flushdb()
        weighted = samples.take(np.flatnonzero(samples.weights > 0).tolist())
        split = split_samples(weighted)
        with _offline_beside(cfg, stream, split, root, trainers.offline) as offline:
            # The baselines are computed here meanwhile; ``offline`` waits for the model.
            return assemble(cfg, stream, weighted, split, offline, queries, online.fallbacks,
                            Timing(started, online_seconds), settings, online.heads,
                            online.mf_ranks)


PARALLEL_FROM_EVENTS = 100_000
"""From this many events replayed, the offline model trains in a second process while this
one computes the baselines (two cores busy); below, one after the other (a second
interpreter costs more than it saves)."""


@contextmanager
def _offline_beside(
    cfg: EvalConfig, stream: Stream, split: Split, root: Path, train: OfflineTrainer
) -> Iterator[Callable[[], tuple[OfflineResult, float]]]:
    """The offline model as a call that returns it and its seconds of training: trained in
    a spawned process (which reads and plans the dataset again, the same events, checked)
    when the replay was long enough (``cfg.parallel``), else here when called."""
    if not _parallel(cfg, len(stream.events)):
        yield lambda: _timed_offline(cfg, stream, split, root, train)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        job = pool.submit(_offline_job, cfg, train, split, _digest(stream.events))
        yield job.result


def _parallel(cfg: EvalConfig, events: int) -> bool:
    """Whether the run uses a second process (``cfg.parallel``, by default from
    :data:`PARALLEL_FROM_EVENTS` events replayed)."""
    return cfg.parallel if cfg.parallel is not None else events >= PARALLEL_FROM_EVENTS


def _digest(events: Sequence[Event]) -> str:
    """A fingerprint of the events replayed (ids and times, in order)."""
    h = hashlib.blake2b(digest_size=16)
    for e in events:
        h.update(f"{e.event_id}\x00{e.ts}\x00".encode())
    return h.hexdigest()


def _offline_job(
    cfg: EvalConfig, train: OfflineTrainer, split: Split, digest: str
) -> tuple[OfflineResult, float]:
    """The second process's work: the same events (checked against ``digest``), then the
    offline model on ``split``."""
    with tempfile.TemporaryDirectory(prefix="vidrec-eval-offline-") as tmp:
        root = Path(tmp)
        stream, _, _ = prepare(replace(cfg, progress=False), root, announce=False)
        if _digest(stream.events) != digest:
            raise ConfigurationError("eval: the offline process read other events than the "
                                     "replay (the dataset changed during the run?)")
        return _timed_offline(cfg, stream, split, root, train)


def _timed_offline(
    cfg: EvalConfig, stream: Stream, split: Split, root: Path, train: OfflineTrainer
) -> tuple[OfflineResult, float]:
    t0 = time.perf_counter()
    return _offline(cfg, stream, split, root, train), time.perf_counter() - t0


def _check_scratch(resources: Resources) -> None:
    client = resources.redis_client
    assert client is not None
    keys = client.dbsize()
    if keys:
        raise ConfigurationError(
            f"eval --redis: the database holds {keys} keys; give an empty scratch database "
            "(the evaluation writes a catalog, activity and tables there and flushes it after)"
        )
