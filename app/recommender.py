"""The recommend use case: candidates, filters, scoring, top-K, and the fallbacks.

Normal path: the user's history and feedback (read together: with Redis stores one
round trip, :mod:`feature_store.sparse.steps`), candidates (given, or retrieved
from the sources), then :class:`~app.scoring.scorer.Scorer`: it maps the ids
to rows of its per-video arrays (reading from the catalog and the counters
only what it lacks or what changed: :mod:`app.scoring.video_table`), filters
them there (unknown, hidden, seen, the request's filters), scores, reranks
(:mod:`app.rerank`: dislikes and served-without-engagement excluded, cold
start, creator demotion and diversity) and a top-K.
A user in a running experiment's arm is scored by that arm's model instead
(:mod:`app.experiments.arms`); the response and its served-log record name the arm.

Ranking: the items are ordered by :func:`fuse` of the model's probability
(as the rerank left it) and :func:`ranking_bonus`: the two-tower affinity
(when the version has towers) and the co-visitation cosine; each item's
``score`` stays the (reranked) probability.

Fallbacks (``fallback: true`` in the response, counted by reason):

- ``unknown_user``: no history, so the personal sources are skipped and the
  candidates are trending and fresh uploads (still ranked by the model);
- ``no_model``: no version loaded yet; candidates keep their source order;
- ``error``: an unexpected exception (a bug) while answering: logged with its
  traceback, answered like ``degraded``;
- ``deadline``: not scored by the request's deadline (``api.recommend_deadline_ms``:
  the process is overloaded, or a backend is slow); answered like ``degraded``
  (:mod:`app.admission`);
- ``degraded``: a backend (Redis, the sparse tables) failed mid-request; the
  answer comes from an in-process popular list refreshed every few seconds
  while the backends were up (:class:`PopularList`), never a 500. Nothing
  about this is sticky: the next request tries the normal path again, so
  service recovers by itself when the backend returns.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple, cast

import numpy as np

from app.candidates.retrieval import Candidate, CandidateFilter, Pool, Retriever
from app.candidates.sources import REQUEST, CandidateQuery
from app.experiments.arms import ArmModels, Assignment
from app.explain import explanations, summary
from app.metrics import Metrics
from app.rerank import Reranker, RerankTrace
from app.schemas import RecommendItem, RecommendRequest, RecommendResponse
from app.scoring.factorization import Read as FactorRead
from app.scoring.factorization import factorization_scores
from app.scoring.fusion import Fusion
from app.scoring.onnx_model import LoadedModel, ModelHolder
from app.scoring.ranking import bonus_terms, fuse, top_k
from app.scoring.retrieval import RetrievalModel
from app.scoring.scorer import Scorer
from app.served_log import Served, ServedLogWriter
from feature_store.activity.base import ActivityStore, HistoryEntry
from feature_store.errors import BackendUnavailable, InvalidInput
from feature_store.events import check_id
from feature_store.factors.base import FactorStore
from feature_store.features.batch import Indices
from feature_store.recommendation_ids import RecommendationIds
from feature_store.redis_errors import REDIS_FAILURES
from feature_store.runtime.log_summary import LogSummary
from feature_store.runtime.worker import periodic
from feature_store.settings import ApiSettings
from feature_store.signals.feedback.base import FeedbackView
from feature_store.sparse.steps import alongside, run, stepped

log = logging.getLogger(__name__)

PoolObserver = Callable[[str, Sequence[str], Sequence[str], np.ndarray], None]
"""Receives ``(user_id, candidate ids, their sources, the model's probabilities)`` in the
pool's source order, after filtering and scoring, before the rerank and the ranking bonus
(the evaluation measures the pool and the ranker alone against the final ranking)."""


BACKEND_ERRORS: tuple[type[BaseException], ...] = (BackendUnavailable, *REDIS_FAILURES)
"""Failures that mean "a backend is down", answered by the degraded fallback."""


class PopularList:
    """Trending and fresh videos kept in memory for the degraded fallback.

    Refreshed by :meth:`maybe_refresh` (from a background thread) at most
    every ``refresh_s``; a failed refresh keeps the previous list.
    """

    def __init__(self, retriever: Retriever, size: int, refresh_s: float) -> None:
        self.retriever = retriever
        self.size = size
        self.refresh_s = refresh_s
        self.items: list[Candidate] = []
        self.refreshed_at = 0.0

    def refresh(self) -> None:
        query = CandidateQuery("", (), int(time.time() * 1000))  # nobody: the popular sources
        self.items = self.retriever.resolve(
            self.retriever.retrieve(query), CandidateFilter(), self.size
        )
        self.refreshed_at = time.monotonic()

    def maybe_refresh(self) -> None:
        if time.monotonic() - self.refreshed_at < self.refresh_s:
            return
        try:
            self.refresh()
        except BACKEND_ERRORS as exc:
            log.warning("popular list refresh failed (keeping %d items): %s", len(self.items), exc)
            self.refreshed_at = time.monotonic()


class Recommender:
    """Answers :class:`RecommendRequest` (see the module docstring)."""

    def __init__(
        self,
        activity: ActivityStore,
        retriever: Retriever,
        scorer: Scorer,
        holder: ModelHolder,
        popular: PopularList,
        metrics: Metrics,
        settings: ApiSettings,
        max_id_length: int,
        clock: Callable[[], float] = time.time,
        served_log: ServedLogWriter | None = None,
        arms: ArmModels | None = None,
        pool_observer: PoolObserver | None = None,
        rerank: Reranker | None = None,
        ids: RecommendationIds | None = None,
        log_summary: LogSummary | None = None,
        factors: FactorStore | None = None,
    ) -> None:
        self.clock = clock
        """Seconds since the epoch of "now" (an evaluation replays history at event time)."""
        self.activity = activity
        self.retriever = retriever
        self.scorer = scorer
        self.holder = holder
        self.popular = popular
        self.metrics = metrics
        self.settings = settings
        self.max_id_length = max_id_length
        self.served_log = served_log
        """Where model-ranked responses are logged (None: not logged)."""
        self.arms = arms
        """The running experiment's arms (None: experiments off)."""
        self.pool_observer = pool_observer
        """Sees each model-ranked request's candidate pool and their probabilities (None:
        nobody)."""
        self.rerank = rerank
        """Exclusions, cold start, demotion and diversity before the top-K (None: plain
        top-K by the ranking)."""
        self.ids = ids or RecommendationIds(secrets.token_bytes(32))
        """Issues each response's ``recommendation_id`` (default: ids of this process only)."""
        self.log_summary = log_summary or LogSummary(log)
        """Where degraded answers are logged: one line per interval, with counts."""
        self.factors = factors
        """The live factorisation's factors (None: no such term)."""

    def validate(self, request: RecommendRequest) -> int:
        """Check what the model cannot (ids, sizes); returns the item count wanted."""
        check_id("user_id", request.user_id, self.max_id_length)
        count = request.count or self.settings.default_count
        if count > self.settings.max_count:
            raise InvalidInput("count", f"must be at most {self.settings.max_count}")
        if request.candidates is not None:
            if len(request.candidates) > self.settings.max_candidates:
                raise InvalidInput(
                    "candidates", f"at most {self.settings.max_candidates} video ids"
                )
            ids = request.candidates
            # Charset and emptiness are checked while parsing (schemas.CandidateId);
            # the configured length here, the per-id loop only to name the bad one.
            if ids and max(map(len, ids)) > self.max_id_length:
                for i, video_id in enumerate(ids):
                    check_id(f"candidates.{i}", video_id, self.max_id_length)
        return count

    def recommend(self, request: RecommendRequest) -> RecommendResponse:
        count = self.validate(request)
        started = time.perf_counter()
        assigned = self.arms.assign(request.user_id) if self.arms is not None else None
        # Read once: in-flight requests keep their version.
        model = self.holder.current if assigned is None else assigned.model
        try:
            response = self._recommend(request, count, model, assigned)
        except BACKEND_ERRORS as exc:
            self.log_summary.record("recommend degraded (a backend is down)", exc)
            response = self._degraded(request, count, model)
        except Exception:  # a bug must cost quality, not the caller's page
            log.exception("recommend failed; answering from the popular list")
            response = self._degraded(request, count, model, reason="error")
        if response.fallback_reason is not None:
            self.metrics.fallbacks.labels(response.fallback_reason).inc()
        self.metrics.observe_stage("total", time.perf_counter() - started)
        return response

    def past_deadline(self, request: RecommendRequest) -> RecommendResponse:
        """The answer to a request not scored by its deadline: popular videos from memory
        (``fallback_reason: "deadline"``), made on the caller's thread in microseconds."""
        count = self.validate(request)
        response = self._degraded(request, count, self.holder.current, reason="deadline")
        self.metrics.fallbacks.labels("deadline").inc()
        return response

    def _recommend(
        self,
        request: RecommendRequest,
        count: int,
        model: LoadedModel | None,
        assigned: Assignment | None = None,
    ) -> RecommendResponse:
        t0 = time.perf_counter()
        now_ms = int(self.clock() * 1000)
        history, feedback, factors = self._user_reads(request.user_id, now_ms,
                                                      request.candidates)
        given = request.candidates is not None
        # Given candidates need the user vector only for the ranking term: it is read
        # while the ranker runs (_Learned), not before.
        query, vector = self._query(request, history, now_ms, model, vector=not given)
        found = self._candidates(request, query)
        self.metrics.observe_stage("candidates", time.perf_counter() - t0)
        self.metrics.candidates.observe(len(found.ids))
        if model is None:
            order = np.arange(min(count, len(found.ids)))
            return self._respond(found, np.zeros(len(found.ids)), order, None, "no_model")
        reason = None if history or given else "unknown_user"
        fusion = assigned.fusion if assigned is not None else None
        heads: dict[str, np.ndarray] | None = {} if request.explain else None
        # The cold start's anonymous scores (its new videos) ride in the user's ONNX run.
        # A user without history is their own reference: their model lift is 0 by
        # definition, not the drift of the other users' training since a kept
        # anonymous score (app/scoring/reference_cache.py).
        new = (
            self.rerank.cold_start.new_positions(self.scorer.extractor.table, found.rows)
            if self.rerank is not None else None
        )
        learned = _Learned(self, request, query, found, model, factors, vector)
        scores, reference, features = self.scorer.score_rows(
            model, request.user_id, now_ms, request.context, history, found.rows, fusion, heads,
            new if history else None, meanwhile=learned,
        )
        if not history and new is not None:
            reference = scores[new]
        if self.pool_observer is not None:
            self.pool_observer(request.user_id, found.ids, found.sources, scores)
        ranked = self._rank(
            request, query, found, scores, learned.terms, count, model, fusion,
            (new, reference), feedback,
        )
        order = ranked.order
        explained = None
        if heads is not None:
            explained = self._explain(found, ranked, scores, heads, fusion)
        logged = self.served_log is not None and features is not None
        response = self._respond(found, ranked.scores, order, model.version, reason, assigned,
                                 explained, logged)
        if logged:
            assert self.served_log is not None and features is not None
            self.served_log.record(Served(  # the model's own scores: its prequential AUC
                response.recommendation_id, request.user_id, now_ms, model.version,
                request.context, found.ids, found.sources, scores, order, features,
                assigned.tag if assigned is not None else None,
            ))
        return response

    def _user_reads(
        self, user_id: str, now_ms: int, candidates: Sequence[str] | None = None
    ) -> tuple[list[HistoryEntry], FeedbackView | None, FactorRead | None]:
        """The user's history and, for the rerank, feedback, and the user's factor (when
        the term is on): read together, so with Redis stores they cost one round trip
        (:mod:`feature_store.sparse.steps`). Given ``candidates``, their counters due for
        a read ride in the same round trip (:meth:`Scorer.stats_steps`)."""
        reads = [stepped(self.activity, "history", user_id)]
        if self.rerank is not None:
            reads.append(stepped(self.rerank.feedback, "read", user_id, now_ms))
        factored = self.factors is not None and self.settings.factorization_weight > 0
        if factored:
            reads.append(stepped(self.factors, "read", user_id))
        counters = self.scorer.stats_steps(candidates) if candidates else None
        results = run(reads if counters is None else [*reads, counters])
        history = cast(list[HistoryEntry], results[0])
        feedback = cast(FeedbackView, results[1]) if self.rerank is not None else None
        factors = cast(FactorRead, results[len(reads) - 1]) if factored else None
        return history, feedback, factors

    def pool(self, request: RecommendRequest) -> Pool:
        """The candidate pool the sources would propose for ``request`` now (before the
        filters), with the served model's towers: what a request retrieves, for tools
        and tests that look at where candidates come from."""
        model = self.holder.current
        history = self.activity.history(request.user_id)
        query, _ = self._query(request, history, int(self.clock() * 1000), model)
        return self.retriever.retrieve(query)

    def _query(
        self,
        request: RecommendRequest,
        history: Sequence[HistoryEntry],
        now_ms: int,
        model: LoadedModel | None,
        vector: bool = True,
    ) -> tuple[CandidateQuery, np.ndarray | None]:
        """What the sources know of the request, and the user's tower vector (None: no
        towers, or a user without history, or not ``vector``: :meth:`user_vector`
        reads it later)."""
        query = CandidateQuery(
            request.user_id, history, now_ms,
            exclude=frozenset(h.video_id for h in history) if request.exclude_seen else (),
        )
        if not vector:
            return query, None
        towers = model.retrieval if model is not None else None
        found = self.user_vector(request, query, model)
        if towers is not None and found is not None:
            query.nearest = partial(_nearest, towers, found)
        return query, found

    def user_vector(
        self, request: RecommendRequest, query: CandidateQuery, model: LoadedModel | None
    ) -> np.ndarray | None:
        """The user's tower vector for ``query`` (None: no towers, or no history), with the
        co-visitation read ``query`` will make travelling beside the towers' row reads
        (one round trip with Redis)."""
        towers = model.retrieval if model is not None else None
        if towers is None or not query.history:
            return None
        return alongside(
            self.retriever.covisit_steps(query, given=request.candidates is not None),
            partial(
                towers.query_vector, request.user_id, query.now_ms, request.context,
                query.history[: self.scorer.schema.history_len],  # what the towers trained on
                self.scorer.row_reader(model), self.settings.covisit_window,
            ),
        )

    def _candidates(self, request: RecommendRequest, query: CandidateQuery) -> Found:
        """The request's candidates (given, or the pool), filtered in the scorer's rows."""
        if request.candidates is not None:
            ids = list(dict.fromkeys(request.candidates))
            pool = Pool(ids, [REQUEST] * len(ids))  # its co-visitations: _Learned reads them
        else:
            pool = self.retriever.retrieve(query)
        f = request.filters
        keep = CandidateFilter(
            seen=frozenset(query.exclude),
            categories=frozenset(f.categories) if f.categories is not None else None,
            max_duration_ms=f.max_duration_ms,
        )
        selected, rows = self.scorer.select(pool.videos, keep, self.settings.max_candidates)
        if selected is None:
            return Found(pool.videos, pool.sources, rows, pool)
        ids = [pool.videos[i] for i in selected]
        return Found(ids, [pool.sources[i] for i in selected], rows, pool)

    def _rank(
        self,
        request: RecommendRequest,
        query: CandidateQuery,
        found: Found,
        scores: np.ndarray,
        learned: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None],
        count: int,
        model: LoadedModel,
        fusion: Fusion | None,
        scored_anonymous: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
        feedback: FeedbackView | None = None,
    ) -> Ranked:
        """The reranked scores and the response's rows, best first, by :func:`fuse`.
        ``scored_anonymous``: candidate positions and their anonymous scores, scored with
        the user's (what the cold start asks for, see :meth:`Scorer.score_rows`).
        ``feedback``: the user's, read with the history (None: the rerank reads it).
        ``learned``: the two-tower affinity, the sequence tower's logits and the live
        factorisation's standardised scores (None: none)."""
        covisits = found.pool.covisits
        terms = bonus_terms(
            len(found.ids),
            learned[0],
            np.fromiter(map(covisits.get, found.ids, repeat(0.0)), np.float64, len(found.ids))
            if covisits else None,
            self.settings.retrieval_weight,
            self.settings.covisit_weight,
            learned[1],
            self.settings.sequence_weight,
            learned[2],
            self.settings.factorization_weight,
        )
        bonus = terms[0] + terms[1] + terms[2] + terms[3]
        if self.rerank is None or not len(found.ids):
            return Ranked(scores, top_k(fuse(scores, bonus), count), terms)

        def anonymous(positions: np.ndarray) -> np.ndarray:
            at, reference = scored_anonymous
            if reference is not None and at is not None and np.array_equal(positions, at):
                return reference
            return self.scorer.anonymous_scores(
                model, query.now_ms, request.context, found.rows[positions], fusion
            )

        trace = RerankTrace() if request.explain else None
        reranked, order = self.rerank.rerank(
            request.user_id, query.now_ms, query.history, request.exclude_served, found.ids,
            self.scorer.extractor.table, found.rows, scores, count, bonus, anonymous, trace,
            feedback,
        )
        return Ranked(reranked, order, terms, trace)

    def _explain(
        self,
        found: Found,
        ranked: Ranked,
        model_scores: np.ndarray,
        heads: dict[str, np.ndarray],
        fusion: Fusion | None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Per item and for the response, why it was shown (:mod:`app.explain`)."""
        items = explanations(
            ranked.order, found.pool.proposers, found.ids, heads, model_scores,
            ranked.scores, ranked.terms, ranked.trace,
        )
        used = fusion or self.scorer.fusion
        return items, summary(used, self.settings, len(found.ids), ranked.trace)

    def _respond(
        self,
        found: Found,
        scores: np.ndarray,
        order: np.ndarray,
        version: str | None,
        reason: str | None,
        arm: Assignment | None = None,
        explained: tuple[list[dict[str, Any]], dict[str, Any]] | None = None,
        logged: bool = False,
    ) -> RecommendResponse:
        """The response of the rows ``order`` (best first), each with its ``scores`` value
        (and, explained, each item's explanation and the response's). ``logged``: its
        record goes to the served log (its id says so)."""
        ids, sources = found.ids, found.sources
        items = [
            {"video_id": ids[i], "score": score, "source": sources[i]}
            for i, score in zip(order.tolist(), scores[order].tolist(), strict=True)
        ]
        if explained is not None:
            for item, why in zip(items, explained[0], strict=True):
                item["explanation"] = why
        # Plain dicts validated in one pydantic-core call: 3x cheaper than 20 model objects.
        return RecommendResponse.model_validate(
            {
                "recommendation_id": self.ids.issue(logged),
                "model_version": version,
                "items": items,
                "fallback": reason is not None,
                "fallback_reason": reason,
                "degraded": False,
                "experiment": None if arm is None else {"id": arm.experiment, "arm": arm.arm},
                "explanation": None if explained is None else explained[1],
            }
        )

    def _degraded(
        self,
        request: RecommendRequest,
        count: int,
        model: LoadedModel | None,
        reason: str = "degraded",
    ) -> RecommendResponse:
        """Popular videos from memory (or the caller's candidates in their order)."""
        if request.candidates is not None:
            items = [
                RecommendItem(video_id=video, score=0.0, source=REQUEST)
                for video in list(dict.fromkeys(request.candidates))[:count]
            ]
        else:
            items = [
                RecommendItem(video_id=c.video.video_id, score=0.0, source=c.source)
                for c in self.popular.items
                if _passes(c, request)
            ][:count]
        return RecommendResponse(
            recommendation_id=self.ids.issue(logged=False),
            model_version=model.version if model else None,
            items=items,
            fallback=True,
            fallback_reason=reason,
            degraded=True,
        )


class Ranked(NamedTuple):
    """The ranking of a request's candidates."""

    scores: np.ndarray
    """The reranked probabilities (each item's ``score``)."""
    order: np.ndarray
    """The response's candidate positions, best first."""
    terms: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """The ranking's bonus terms (:func:`~app.scoring.ranking.bonus_terms`)."""
    trace: RerankTrace | None = None
    """What the rerank did (an explained request only)."""


class Found(NamedTuple):
    """A request's candidates after the filters: ids, first sources, video-table rows."""

    ids: list[str]
    sources: list[str]
    rows: Indices
    pool: Pool
    """The pool they came from (every proposer, the co-visitation cosines)."""


class _Learned:
    """The ranking's learned terms of one request, computed while its ranker runs
    (:func:`app.scoring.overlap.beside`): none of them needs the ranker's scores.

    :attr:`terms` is the two-tower affinity, the sequence tower's logits and the
    live factorisation's standardised scores (each None: none). For given
    candidates it first reads what :meth:`Recommender._query` left for it: the
    user vector and, beside it, the co-visitation cosines (the ranking's
    co-visitation term, put in the candidates' pool). Called once, by
    :meth:`Scorer.score_rows`.
    """

    def __init__(
        self,
        recommender: Recommender,
        request: RecommendRequest,
        query: CandidateQuery,
        found: Found,
        model: LoadedModel,
        factors: FactorRead | None,
        vector: np.ndarray | None,
    ) -> None:
        self.recommender = recommender
        self.request, self.query, self.found, self.model = request, query, found, model
        self.factors, self.vector = factors, vector
        self.terms: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] = (
            None, None, None
        )

    def __call__(self) -> None:
        rec, found, model, vector = self.recommender, self.found, self.model, self.vector
        if self.request.candidates is not None:
            vector = rec.user_vector(self.request, self.query, model)
            found.pool.covisits = rec.retriever.covisits(self.query)
        towers = model.retrieval
        self.terms = (
            towers.affinity(vector, found.ids) if towers and vector is not None else None,
            _sequence_logits(model, self.query.history, found.ids),
            factorization_scores(self.factors, found.ids),
        )


def _sequence_logits(
    model: LoadedModel, history: Sequence[HistoryEntry], ids: Sequence[str]
) -> np.ndarray | None:
    """The sequence tower's logits times its learnt weight (None: no tower, no known view,
    or a weight of 0)."""
    tower = model.sequence
    if tower is None or not tower.weight:
        return None
    logits = tower.logits(history, ids)
    return None if logits is None else logits * tower.weight


def _nearest(
    towers: RetrievalModel, vector: np.ndarray, k: int, exclude: Collection[str]
) -> list[str]:
    return towers.neighbours(vector, k, exclude)


def _passes(candidate: Candidate, request: RecommendRequest) -> bool:
    f = request.filters
    return CandidateFilter(
        categories=frozenset(f.categories) if f.categories is not None else None,
        max_duration_ms=f.max_duration_ms,
    ).keeps(candidate.video)


class PopularRefresher:
    """Background thread refreshing a :class:`PopularList`."""

    def __init__(self, popular: PopularList) -> None:
        self.popular = popular
        self._worker = periodic(
            "vidrec-popular",
            min(1.0, popular.refresh_s),
            popular.maybe_refresh,
            join_timeout_s=5,
        )

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()
