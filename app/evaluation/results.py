"""The figures of one evaluation: every model on the same rows, moments and queries.

:func:`assemble` takes what the replay produced (the trainer's weighted
samples with their prequential scores, the answered queries, the offline
model's test scores) and computes, for the online model and each baseline:
AUC and logloss on the last 20% and overall, AUC on the last 20% per moment
(:func:`~app.evaluation.metrics.moments`), AUC per time window, and the
ranking figures of the queries. The baselines are scored here, in one
prequential pass each over the same samples (:mod:`~app.evaluation.baselines`);
the ranking-only ones (co-occurrence, matrix factorisation) answer the
queries from the samples trained before each. Beside the service's final
ranking, :data:`RANKER_ROW` orders the same candidates by the model's
probability alone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from app.evaluation import baselines, factorization
from app.evaluation.metrics import Floats, moments, rank_in, rank_of, recall_ndcg, windows
from app.evaluation.stream import Split, Stream
from feature_store.models.quality import log_loss, roc_auc
from feature_store.models.scored import OfflineResult, ScoredSamples
from feature_store.settings import Settings

if TYPE_CHECKING:
    from app.evaluation.runner import EvalConfig, Query

log = logging.getLogger(__name__)

_DAY_MS = 86_400_000


@dataclass
class ModelFigures:
    name: str
    auc_test: float
    logloss_test: float
    auc_test_moments: float = math.nan
    """AUC on the last 20%, one score per moment (per rating) instead of per sample."""
    auc_all: float = math.nan
    logloss_all: float = math.nan
    recall: float = math.nan
    """Recall@k of the retrieval protocol, or HR@k of leave-one-out."""
    ndcg: float = math.nan
    window_auc: list[float] = field(default_factory=list)
    auc_fit: float = math.nan
    """AUC on the first 80% (train + validation rows): what settings may be tuned on."""
    unscored_test_rows: int = 0
    """Rows of the last 20% this model has no score for (left out of its figures)."""


@dataclass
class EvalResult:
    dataset: str
    title: str
    """The dataset as named in reports (``MovieLens 100K``, a file name) and the protocol."""
    protocol: Literal["retrieval", "loo"]
    negatives: int
    catalog: bool
    """Videos were known (MovieLens, or ``--catalog``); without them no retrieval figures."""
    shift_days: float
    """Days added to every timestamp (the data predated ``limits.min_ts_ms``)."""
    rejected_rows: int
    rejected_examples: list[str]
    events: int
    samples: int
    test_rows: int
    test_moments: int
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
    k: int
    candidates_per_query: float
    """Leave-one-out: mean videos ranked per query (1 + the sampled ones); 0 for retrieval."""
    service_candidate_recall: float
    """Share of queries whose item was among the service's answer (any rank)."""
    service_fallbacks: dict[str, int]
    user_attributes: bool
    """The users' age group, gender and occupation were features."""
    positive_watch_ratio: float
    """``features.positive_watch_ratio``: plays from it are positives and enter the history."""
    seconds: float
    online_seconds: float
    offline_seconds: float
    events_per_s: float
    heads: dict[str, float] = field(default_factory=dict)
    """The other ranking heads' prequential figures over the replay (``negative_auc``,
    ``watch_spearman``... with their popularity baselines; ``trainer/metrics.py``)."""
    full_ranking: bool = False
    """Leave-one-out against the whole catalog minus each user's earlier views."""
    skipped: list[str] = field(default_factory=list)
    """Why a baseline has no row (e.g. its library is not installed)."""

    def model(self, name: str) -> ModelFigures:
        return next(m for m in self.models if m.name == name)


@dataclass
class Timing:
    started: float
    """``time.perf_counter()`` when the evaluation began."""
    online_seconds: float


OfflineWait = Callable[[], tuple[OfflineResult, float]]
"""Returns the offline model and its seconds of training, waiting for it if it trains in
another process (called once, after the baselines)."""


@dataclass
class _Rows:
    """Which samples each figure is over."""

    labels: Floats
    test: npt.NDArray[np.int64]
    fit: npt.NDArray[np.int64]
    slices: list[tuple[int, int]]
    moment_first: npt.NDArray[np.int64]
    """First sample of each moment of the last 20%."""
    moment_labels: Floats

    @classmethod
    def of(cls, weighted: ScoredSamples, test: npt.NDArray[np.int64], count: int,
           window_ms: int) -> _Rows:
        n = len(weighted.event_ids)
        first, labels = moments(weighted.user_ids, weighted.video_ids, weighted.ts_ms,
                                weighted.labels, window_ms)
        in_test = np.zeros(n, dtype=bool)
        in_test[test] = True
        keep = in_test[first] if len(first) else np.zeros(0, dtype=bool)
        return cls(weighted.labels, test, np.flatnonzero(~in_test), windows(n, count),
                   first[keep], labels[keep])

    def figures(self, name: str, scores: Floats, ranks: list[int | None] | None,
                k: int) -> ModelFigures:
        """Every figure of one model's scores (NaN where a model has no score)."""
        labels, test = self.labels, self.test
        recall, ndcg = recall_ndcg(ranks, k) if ranks else (math.nan, math.nan)
        unscored = int(np.isnan(scores[test]).sum())
        return ModelFigures(
            unscored_test_rows=unscored if unscored < len(test) else 0,
            name=name,
            auc_fit=_auc(scores[self.fit], labels[self.fit]),
            auc_test=_auc(scores[test], labels[test]),
            logloss_test=_logloss(scores[test], labels[test]),
            auc_test_moments=_auc(scores[self.moment_first], self.moment_labels),
            auc_all=_auc(scores, labels),
            logloss_all=_logloss(scores, labels),
            recall=recall,
            ndcg=ndcg,
            window_auc=[
                math.nan if np.isnan(scores[a:b]).any() else _auc(scores[a:b], labels[a:b])
                for a, b in self.slices
            ],
        )


POOL_ROW = "candidate pool, sources' order"
"""The row of the service's candidates ranked in their sources' interleave order."""
RANKER_ROW = "ranker alone (probability order)"
"""The row of the service's candidates ordered by the model's probability only: the
final ranking without the retrieval and co-visitation bonus and the rerank."""
SEQUENCE_ROW = "sequence tower alone (logit order)"
"""The row of the service's candidates ordered by the served sequence tower's logit only
(``trainer/sequence.py``): the user's recent views read in order, nothing else."""
MF_ROW = "matrix factorisation (ALS)"
"""The row of :class:`~app.evaluation.factorization.MatrixFactorization`."""


def _auc(scores: Floats, labels: Floats) -> float:
    """AUC over the rows that have a score (NaN: none, or one class only)."""
    scored = ~np.isnan(scores)
    return roc_auc(scores[scored], labels[scored])


def _logloss(scores: Floats, labels: Floats) -> float:
    scored = ~np.isnan(scores)
    return log_loss(scores[scored], labels[scored])


def _popularity(
    name: str, model: baselines.Popularity, weighted: ScoredSamples, queries: list[Query],
    k: int,
) -> tuple[Floats, list[int | None]]:
    """Prequential scores of every sample, and each query answered at its moment."""
    stops: dict[int, list[int]] = {}
    for qi, q in enumerate(queries):
        stops.setdefault(q.before, []).append(qi)
    ranks: list[int | None] = [None] * len(queries)

    def answer(qi: int) -> None:
        q = queries[qi]
        if q.candidates:
            ranks[qi] = rank_in(q.video, q.candidates, model.positives(q.candidates, q.ts))
        else:
            ranks[qi] = rank_of(q.video, model.top(k, q.ts, q.seen))

    scores = baselines.prequential(
        model, weighted.video_ids, weighted.ts_ms.tolist(), weighted.labels, stops, answer
    )
    log.info("%s: scored %d samples", name, len(scores))
    return scores, ranks


def _co_occurrence(weighted: ScoredSamples, queries: list[Query]) -> list[int | None]:
    model = baselines.CoOccurrence(weighted.user_ids, weighted.video_ids, weighted.labels > 0.5)
    return [
        rank_in(q.video, q.candidates, model.scores(q.user, q.candidates, q.before))
        for q in queries
    ]


def _factorization(
    cfg: EvalConfig, weighted: ScoredSamples, queries: list[Query], k: int
) -> list[int | None]:
    """Matrix factorisation's rank of each query's item: among its candidates (loo), or in
    its top ``k`` of the videos with a factor minus those the service excluded."""
    model = factorization.MatrixFactorization(
        weighted.user_ids, weighted.video_ids, weighted.labels > 0.5, cfg.mf, cfg.seed
    )
    with model.prefitted([q.before for q in queries]):  # the refits, in worker processes
        ranks = [
            rank_in(q.video, q.candidates, model.scores(q.user, q.candidates, q.before))
            if q.candidates else rank_of(q.video, model.top(q.user, k, q.before, q.seen))
            for q in queries
        ]
    log.info("matrix factorisation: %d fits for %d questions", model.fits, len(queries))
    return ranks


def _offline_scores(weighted: ScoredSamples, offline: OfflineResult) -> Floats:
    """The offline model's test scores aligned with ``weighted`` (NaN elsewhere, and
    everywhere when no epoch was chosen: no validation AUC, e.g. a single class)."""
    index = {eid: i for i, eid in enumerate(weighted.event_ids)}
    scores = np.full(len(weighted.event_ids), np.nan)
    if offline.best_epoch == 0:
        return scores
    for eid, score in zip(offline.test.event_ids, offline.test.scores, strict=True):
        scores[index[eid]] = score
    return scores


def assemble(
    cfg: EvalConfig,
    stream: Stream,
    weighted: ScoredSamples,
    split: Split,
    offline_wait: OfflineWait,
    queries: list[Query],
    fallbacks: dict[str, int],
    timing: Timing,
    settings: Settings,
    heads: dict[str, float] | None = None,
    mf_ranks: list[int] | None = None,
) -> EvalResult:
    """The result of a run (see the module doc); ``settings`` are the online run's;
    ``mf_ranks``: the matrix-factorisation baseline's, when worked out during the replay."""
    index = {eid: i for i, eid in enumerate(weighted.event_ids)}
    test_idx = np.array([index[e] for e in split.test], dtype=np.int64)
    # The trainer's join window: samples of one (user, video) within it are one moment.
    rows = _Rows.of(weighted, test_idx, cfg.windows, settings.trainer.join_window_ms)
    models, skipped = _model_rows(cfg, rows, weighted, queries, mf_ranks)
    offline, offline_seconds = offline_wait()
    models.insert(len(models) - (1 if queries else 0), _offline_row(cfg, rows, weighted, offline))
    fit_users = {weighted.user_ids[index[e]] for e in (*split.train, *split.valid)}
    test_user_rows = [weighted.user_ids[i] for i in test_idx.tolist()]
    new_users, new_rows = _new_test_users(fit_users, test_user_rows)
    labels = weighted.labels
    return EvalResult(
        dataset=str(cfg.dataset),
        title=_title(stream.name, cfg),
        protocol=cfg.protocol,
        negatives=cfg.negatives,
        catalog=stream.catalog,
        shift_days=stream.shift_ms / _DAY_MS,
        rejected_rows=stream.rejected.count,
        rejected_examples=stream.rejected.examples,
        events=len(stream.events),
        samples=len(weighted.event_ids),
        test_rows=len(test_idx),
        test_moments=len(rows.moment_first),
        positive_rate=float(labels.mean()) if len(labels) else math.nan,
        new_test_users=new_users,
        new_test_rows=new_rows,
        models=models,
        window_ends_ms=[int(weighted.ts_ms[b - 1]) for _, b in rows.slices],
        test_start_ms=split.test_start_ts,
        offline_epochs=offline.epochs,
        offline_best_epoch=offline.best_epoch,
        queries=len(queries),
        k=cfg.cutoff,
        candidates_per_query=_candidates_per_query(cfg, queries),
        service_candidate_recall=(
            sum(q.rank is not None for q in queries) / len(queries) if queries else math.nan
        ),
        service_fallbacks=fallbacks,
        user_attributes=bool(stream.users) and cfg.user_attributes,
        positive_watch_ratio=settings.features.positive_watch_ratio,
        seconds=time.perf_counter() - timing.started,
        online_seconds=timing.online_seconds,
        offline_seconds=offline_seconds,
        events_per_s=len(stream.events) / max(timing.online_seconds, 1e-9),
        heads=dict(heads or {}),
        full_ranking=cfg.full_ranking,
        skipped=skipped,
    )


def _model_rows(
    cfg: EvalConfig,
    rows: _Rows,
    weighted: ScoredSamples,
    queries: list[Query],
    mf_ranks: list[int] | None = None,
) -> tuple[list[ModelFigures], list[str]]:
    """Every model's figures but the offline one's, in the report's order, and the rows
    skipped (and why)."""
    k = cfg.cutoff
    models = [rows.figures("online Wide&Deep", weighted.scores, [q.rank for q in queries], k)]
    nothing = np.full(len(weighted.event_ids), np.nan)
    if queries:
        models.append(rows.figures(RANKER_ROW, nothing, [q.ranker_rank for q in queries], k))
    if any(q.sequence_rank is not None for q in queries):
        models.append(rows.figures(SEQUENCE_ROW, nothing, [q.sequence_rank for q in queries],
                                   k))
    for name, model in (
        ("popularity", baselines.Popularity()),
        (f"recent popularity ({cfg.half_life_days:g} d)",
         baselines.Popularity(cfg.half_life_days * _DAY_MS)),
    ):
        scores, ranks = _popularity(name, model, weighted, queries, k)
        models.append(rows.figures(name, scores, ranks, k))
    if cfg.protocol == "loo":
        models.append(rows.figures("co-occurrence", nothing, _co_occurrence(weighted, queries),
                                   k))
    skipped = []
    if queries and factorization.available():
        mf: list[int | None] = (
            list(mf_ranks) if mf_ranks is not None else _factorization(cfg, weighted, queries, k))
        models.append(rows.figures(MF_ROW, nothing, mf, k))
    elif queries:
        log.warning("%s", factorization.MISSING)
        skipped.append(factorization.MISSING)
    if queries:  # what the model's ranking adds over its own candidates' source order
        models.append(rows.figures(POOL_ROW, nothing, [q.pool_rank for q in queries], k))
    return models, skipped


def _offline_row(
    cfg: EvalConfig, rows: _Rows, weighted: ScoredSamples, offline: OfflineResult
) -> ModelFigures:
    """The offline model's figures: on the last 20% only (it trained on the rest)."""
    off = rows.figures(f"offline Wide&Deep (epoch {offline.best_epoch})",
                       _offline_scores(weighted, offline), None, cfg.cutoff)
    off.auc_all = off.logloss_all = off.auc_fit = math.nan
    return off


def _new_test_users(fit_users: set[str], test_user_rows: list[str]) -> tuple[float, float]:
    """Shares of the test rows' users, and of the test rows, whose user the first 80%
    never saw."""
    test_users = set(test_user_rows)
    return (
        len(test_users - fit_users) / max(1, len(test_users)),
        sum(u not in fit_users for u in test_user_rows) / max(1, len(test_user_rows)),
    )


def _candidates_per_query(cfg: EvalConfig, queries: list[Query]) -> float:
    """Mean candidates ranked per leave-one-out question (0 for the retrieval protocol)."""
    if not queries or cfg.protocol != "loo":
        return 0.0
    return float(np.mean([len(q.candidates) for q in queries]))


def _title(name: str, cfg: EvalConfig) -> str:
    """The dataset's name, and the protocol when it is not the default retrieval one."""
    parts = [name]
    if cfg.protocol == "loo":
        parts.append("leave-one-out, full ranking" if cfg.full_ranking else "leave-one-out")
    if cfg.negatives:
        parts.append(f"{cfg.negatives} negative{'s' if cfg.negatives > 1 else ''} per view")
    return ", ".join(parts)
