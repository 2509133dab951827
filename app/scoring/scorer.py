"""Scoring candidates for one user: features, one pull per table, one ONNX run.

Per request: the candidates' features are extracted in one vectorised pass
(:mod:`app.scoring.features`); each embedding table's *unique* keys, and the
wide keys, are pulled once (weights only, ``train=False``: an unknown key is
a zero row) into the temporary embedding matrices the model takes as inputs;
:func:`feature_store.models.model_io.build_feed` assembles the feed; the batch is
padded to its warmed bucket and scored by one ``session.run``, which gives
every ranking head; :mod:`app.scoring.fusion` turns them into the one score
per candidate the scorer returns (``api.ranking_weights``, or the request's
experiment arm's weights).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from app.cache import RowReader
from app.candidates.retrieval import CandidateFilter
from app.scoring.features import RequestFeatureExtractor
from app.scoring.fusion import ENGAGEMENT_ONLY, Fusion
from app.scoring.onnx_model import LoadedModel, pad_batch
from app.scoring.overlap import beside
from app.scoring.reference_cache import ReferenceCache
from app.scoring.video_table import VideoSource
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.events import EventContext
from feature_store.features.extract import BatchFeatures, Indices
from feature_store.features.schema import WIDE_TABLE, FeatureSchema
from feature_store.models import model_io
from feature_store.sparse.base import SparseTable
from feature_store.sparse.steps import Steps

StageObserver = Callable[[str, float], None]
"""Receives ``(stage, seconds)`` for the per-stage latency histograms."""

WARMUP_TS_MS = 1_700_000_000_000

ANONYMOUS = "~anonymous"
"""The user id of :meth:`Scorer.anonymous_scores`: outside the id charset (``~``), so no
real user's events ever train its row."""

_EVERY_HEAD = Fusion.of({h: 1.0 for h in model_io.HEADS})
"""A fusion that reads every output (the warm-up runs them all)."""


class Scored(NamedTuple):
    """What :meth:`Scorer.score_rows` gives for one request."""

    scores: npt.NDArray[np.float32]
    """The served (fused) score per row, for the user."""
    anonymous: npt.NDArray[np.float32] | None
    """Per ``anonymous_positions`` position, the score for an anonymous user (None: none
    asked)."""
    features: BatchFeatures | None
    """The user's rows' features (None for no rows): what the served log records."""


class Scorer:
    """Scores (user, candidates) with a :class:`LoadedModel`. Thread-safe."""

    def __init__(
        self,
        schema: FeatureSchema,
        tables: Mapping[str, SparseTable],
        observe: StageObserver | None = None,
        pull: RowReader | None = None,
        videos: VideoSource | None = None,
        fusion: Fusion = ENGAGEMENT_ONLY,
        reference_ttl_s: float = 0.0,
    ) -> None:
        self.schema = schema
        self.reference_ttl_s = reference_ttl_s
        """How long an anonymous score is reused (:mod:`app.scoring.reference_cache`)."""
        self.fusion = fusion
        """How the heads become the served score, unless a request brings its own."""
        self.videos = videos
        """Where :meth:`select` reads candidates' records and counters."""
        self.tables = tables
        self.observe = observe or (lambda stage, seconds: None)
        self._pull = pull or RowReader(tables, None)
        """Row reader: the tables directly, or through the service's short-TTL cache."""
        self._local = threading.local()

    @property
    def extractor(self) -> RequestFeatureExtractor:
        """This thread's extractor (key hashers and the per-video cache are not shared)."""
        extractor: RequestFeatureExtractor | None = getattr(self._local, "extractor", None)
        if extractor is None:
            extractor = self._local.extractor = RequestFeatureExtractor(self.schema)
        return extractor

    @property
    def references(self) -> ReferenceCache:
        """This thread's anonymous scores, kept per row of its extractor's video table."""
        cache: ReferenceCache | None = getattr(self._local, "references", None)
        if cache is None:
            cache = self._local.references = ReferenceCache(self.reference_ttl_s)
        return cache

    def features(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        videos: Sequence[Video],
        stats: Sequence[VideoStats],
    ) -> BatchFeatures:
        return self.extractor.extract_request(user_id, ts_ms, context, history, videos, stats)

    def row_reader(self, model: LoadedModel | None = None) -> RowReader:
        """The row reader of ``model``'s family's tables (else this scorer's tables)."""
        return model.pull if model is not None and model.pull is not None else self._pull

    def pull(
        self, batch: BatchFeatures, model: LoadedModel | None = None
    ) -> tuple[dict[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]]:
        """Weights of the batch's unique keys: every table's and the wide table's, read
        together (:meth:`RowReader.many`: one round trip to Redis for them all).

        Read from ``model``'s family's tables when it names them, else from
        this scorer's tables.
        """
        rows = self.row_reader(model).many({**batch.table_keys, WIDE_TABLE: batch.wide_keys})
        wide = rows.pop(WIDE_TABLE)
        return rows, wide

    def run(
        self,
        model: LoadedModel,
        batch: BatchFeatures,
        rows: dict[str, npt.NDArray[np.float32]],
        wide: npt.NDArray[np.float32],
        fusion: Fusion | None = None,
        heads: dict[str, npt.NDArray[np.float32]] | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> npt.NDArray[np.float32]:
        """One ONNX run over the batch padded to its bucket; fused scores of the real rows.
        ``heads``: filled with every head's prediction (an explained request).
        ``meanwhile``: called on a helper thread while the run goes on on this one
        (:func:`app.scoring.overlap.beside`)."""
        padded = pad_batch(batch, model.bucket(batch.batch_size))
        feed = model_io.build_feed(
            self.schema, padded, rows, wide, model.row_shaped, model.sequence_rows
        )
        fusion = fusion or self.fusion
        n = batch.batch_size
        if fusion.identity and heads is None:
            return beside(lambda: model.run(feed), meanwhile)[:n]
        every = {h: p[:n] for h, p in beside(lambda: model.run_heads(feed), meanwhile).items()}
        if heads is not None:
            heads.update(every)
        return fusion.fuse(every)

    def stats_steps(self, video_ids: Sequence[str]) -> Steps[None] | None:
        """This thread's video table's read of the counters :meth:`select` would read for
        ``video_ids`` (:meth:`VideoTable.stats_steps`), to run beside other reads."""
        if self.videos is None:
            return None
        return self.extractor.table.stats_steps(video_ids, self.videos)

    def select(
        self, video_ids: Sequence[str], keep: CandidateFilter, cap: int
    ) -> tuple[list[int] | None, Indices]:
        """Which of ``video_ids`` to score, and their rows in this thread's video table.

        The positions (into ``video_ids``) of the known, visible ids that pass
        ``keep``, at most ``cap``, in order; None when that is all of them.
        """
        if self.videos is None:
            raise RuntimeError("this scorer was built without a video source")
        table = self.extractor.table
        rows = table.lookup(video_ids, self.videos)
        ok = table.passing(rows, keep)
        if len(rows) <= cap and ok.all():
            return None, rows
        positions = np.flatnonzero(ok)[:cap]
        return positions.tolist(), rows[positions]

    def score_rows(
        self,
        model: LoadedModel,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        rows: Indices,
        fusion: Fusion | None = None,
        heads: dict[str, npt.NDArray[np.float32]] | None = None,
        anonymous_positions: Indices | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> Scored:
        """:meth:`score` for rows of this thread's video table (from :meth:`select`), with
        the features scored (None for no rows), which the served log records. ``fusion``:
        the request's weights over the heads (an experiment arm's), else the scorer's.
        ``heads``: filled with every head's prediction, from the same run.
        ``anonymous_positions``: positions in ``rows`` also scored for an anonymous user
        (:meth:`anonymous_scores`), in the same batch, pull and ONNX run
        (:meth:`RequestFeatureExtractor.extract_with_reference`), but for those whose
        anonymous score was computed less than ``reference_ttl_s`` ago (reused).
        ``meanwhile``: the caller's work that does not need these scores, done while the
        ONNX run goes on (:meth:`run`); called once in any case, here when there are no
        rows to run."""
        if not len(rows):
            if meanwhile is not None:
                meanwhile()
            return Scored(np.zeros(0, dtype=np.float32), None, None)
        t0 = time.perf_counter()
        extractor = self.extractor
        if anonymous_positions is None or not len(anonymous_positions):
            batch = extractor.extract_rows(user_id, ts_ms, context, history, rows)
            scores = self._pull_and_run(model, batch, t0, fusion, heads=heads,
                                        meanwhile=meanwhile)
            return Scored(scores, None, batch)
        key = self._reference_key(model, fusion, context)
        reference, kept = self.references.get(extractor.table, key, rows[anonymous_positions])
        if kept.all():
            batch = extractor.extract_rows(user_id, ts_ms, context, history, rows)
            scores = self._pull_and_run(model, batch, t0, fusion, heads=heads,
                                        meanwhile=meanwhile)
            return Scored(scores, reference, batch)
        missing = anonymous_positions[~kept]
        both = extractor.extract_with_reference(
            user_id, ts_ms, context, history, rows, ANONYMOUS, missing
        )
        every: dict[str, npt.NDArray[np.float32]] | None = {} if heads is not None else None
        scores = self._pull_and_run(model, both, t0, fusion, heads=every, meanwhile=meanwhile)
        n = len(rows)
        if heads is not None and every is not None:
            heads.update({h: p[:n] for h, p in every.items()})
        reference[~kept] = scores[n:]
        self.references.put(extractor.table, key, rows[missing], scores[n:])
        return Scored(scores[:n], reference, both.first_rows(n))

    def anonymous_scores(
        self,
        model: LoadedModel,
        ts_ms: int,
        context: EventContext,
        rows: Indices,
        fusion: Fusion | None = None,
    ) -> npt.NDArray[np.float32]:
        """What ``model`` scores the videos of ``rows`` for an anonymous user: no id (an
        untrained user row, zeros), no history, the request's context. The cold start's
        reference (:mod:`app.cold_start`): a user's score above it is what the model
        reads of that user."""
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        table, key = self.extractor.table, self._reference_key(model, fusion, context)
        scores, kept = self.references.get(table, key, rows)
        if kept.all():
            return scores
        missing = rows[~kept]
        batch = self.extractor.extract_rows(ANONYMOUS, ts_ms, context, (), missing)
        scores[~kept] = self._pull_and_run(model, batch, time.perf_counter(), fusion, stages=False)
        self.references.put(table, key, missing, scores[~kept])
        return scores

    def _reference_key(
        self, model: LoadedModel, fusion: Fusion | None, context: EventContext
    ) -> tuple[str, Fusion, EventContext]:
        """What an anonymous score depends on besides the video: the kept scores' key."""
        return model.version, fusion or self.fusion, context

    def score(
        self,
        model: LoadedModel,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        videos: Sequence[Video],
        stats: Sequence[VideoStats],
    ) -> npt.NDArray[np.float32]:
        """The served (fused) score per video, in the order given."""
        if not videos:
            return np.zeros(0, dtype=np.float32)
        t0 = time.perf_counter()
        batch = self.features(user_id, ts_ms, context, history, videos, stats)
        return self._pull_and_run(model, batch, t0)

    def _pull_and_run(
        self,
        model: LoadedModel,
        batch: BatchFeatures,
        t0: float,
        fusion: Fusion | None = None,
        stages: bool = True,
        heads: dict[str, npt.NDArray[np.float32]] | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> npt.NDArray[np.float32]:
        """Pull and score ``batch``; observes the three stages (features from ``t0``)
        unless ``stages`` is off (a second, smaller run of the same request). With
        ``meanwhile`` the ``onnx`` stage is the run and that work, whichever is longer."""
        t1 = time.perf_counter()
        rows, wide = self.pull(batch, model)
        t2 = time.perf_counter()
        scores = self.run(model, batch, rows, wide, fusion, heads, meanwhile)
        t3 = time.perf_counter()
        if stages:
            self.observe("features", t1 - t0)
            self.observe("pull", t2 - t1)
            self.observe("onnx", t3 - t2)
        return scores

    def warm(self, model: LoadedModel, size: int) -> None:
        """Run ``model`` once on a synthetic batch of ``size`` rows.

        The synthetic keys are pulled from the model's family's tables (rows
        nobody trained: zeros), so a family whose tables cannot be read fails
        here, off the request path, before the model is published.
        """
        extractor = RequestFeatureExtractor(self.schema)
        videos = [
            Video(
                video_id=f"warmup-{i}",
                creator_id=f"warmup-c{i % 7}",
                category=f"warmup-{i % 3}",
                tags=("warmup",),
                duration_ms=60_000,
                uploaded_at=WARMUP_TS_MS,
            )
            for i in range(size)
        ]
        history = [HistoryEntry(video_id=f"warmup-{i}", watch_ratio=1.0, ts=0) for i in range(3)]
        batch = extractor.extract_request(
            "warmup", WARMUP_TS_MS, EventContext(), history, videos, [VideoStats()] * size
        )
        rows, wide = self.pull(batch, model)
        self.run(model, batch, rows, wide, _EVERY_HEAD)  # every output warmed
