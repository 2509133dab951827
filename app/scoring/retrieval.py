"""The two-tower model at serving time: user vector, nearest videos, affinity.

Loaded with a model version (:attr:`app.scoring.onnx_model.LoadedModel.retrieval`;
None when the version has no towers, which then serves without the
``embedding`` source). Per request: the user columns' keys (the same
extractor code as the ranker's features), one pull per tower table, numpy
pooling (:func:`feature_store.models.retrieval_io.pool`), one run of the user
tower's ONNX graph; then the video vectors are searched.

The search is :class:`app.candidates.ann_rebuild.LiveIndex` over the
version's video vectors (``docs/retrieval.md``, *The index*): an exact scan
below ``ann.exact_below`` vectors (1,682 x 32 floats for ml-100k), faiss
IVF-Flat above. It is built while the version loads, in the model holder's
thread, so a new user tower never serves against another version's video
vectors, and restored from ``ann_dir`` when that holds this version's index.
Hidden videos are excluded at export and removed when hidden later; the
scorer's filter drops any hidden candidate besides.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from app.cache import RowReader
from app.candidates.ann_rebuild import LiveIndex
from feature_store.activity.base import HistoryEntry
from feature_store.errors import VidrecError
from feature_store.events import EventContext
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import FeatureSchema
from feature_store.models.registry import Manifest, ModelRegistry
from feature_store.models.retrieval_io import (
    MANIFEST_KEY,
    POOLED,
    USER_TOWER_FILE,
    VECTOR,
    VIDEO_IDS_FILE,
    VIDEO_VECTORS_FILE,
    Towers,
    pool,
    tower_table,
)
from feature_store.settings import AnnSettings, RetrievalSettings

log = logging.getLogger(__name__)

Pull = RowReader
"""Reads rows of sparse tables by name (the scorer's or the model family's reader)."""


class RetrievalModel:
    """A version's towers (see the module docstring). Thread-safe."""

    def __init__(
        self,
        version: str,
        towers: Towers,
        session: ort.InferenceSession,
        index: LiveIndex,
        query: str = "user",
    ) -> None:
        self.version = version
        self.query = query
        """``user``: search with the user tower's vector; ``history``: with the mean of
        the recent watches' video vectors (``retrieval.query``)."""
        self.towers = towers
        self.session = session
        self.index = index
        self.user_schema = FeatureSchema(columns=towers.user)
        self._local = threading.local()

    @property
    def extractor(self) -> FeatureExtractor:
        """This thread's extractor of the user columns (hashers are not shared)."""
        extractor: FeatureExtractor | None = getattr(self._local, "extractor", None)
        if extractor is None:
            extractor = self._local.extractor = FeatureExtractor(self.user_schema)
        return extractor

    def query_vector(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        pull: Pull,
        window: int,
    ) -> npt.NDArray[np.float32] | None:
        """The vector searched and scored against for this request (see :attr:`query`);
        None when there is none (``history`` query, no recent watch with a vector)."""
        if self.query == "user":
            return self.user_vector(user_id, ts_ms, context, history, pull)
        recent = [h.video_id for h in history if h.positive][:window]
        vectors, known = self.index.vectors_of(recent)
        if not known.any():
            return None
        mean = np.asarray(vectors[known], dtype=np.float32).mean(axis=0)
        norm = float(np.linalg.norm(mean))
        return (mean / norm if norm > 0 else mean).astype(np.float32)

    def user_vector(
        self,
        user_id: str,
        ts_ms: int,
        context: EventContext,
        history: Sequence[HistoryEntry],
        pull: Pull,
    ) -> npt.NDArray[np.float32]:
        """The user's ``(dim,)`` vector from the request's features."""
        row = FeatureRow(
            user_id=user_id, video_id="", ts_ms=ts_ms, context=context, history=tuple(history)
        )
        pooled = user_inputs(self.towers, self.extractor, [row], pull)
        (vector,) = self.session.run([VECTOR], {POOLED: pooled})
        return np.asarray(vector[0], dtype=np.float32)

    def neighbours(
        self, vector: npt.NDArray[np.float32], k: int, exclude: Collection[str] = ()
    ) -> list[str]:
        """The ``k`` videos nearest the user vector, best first."""
        ids, _ = self.index.search(vector, k, exclude)
        return ids

    def affinity(
        self, vector: npt.NDArray[np.float32], ids: Sequence[str]
    ) -> npt.NDArray[np.float32]:
        """Cosine of the user vector with each video's; 0 (no evidence) for a video
        without a vector (uploaded after the export)."""
        vectors, known = self.index.vectors_of(ids)
        if not known.any():
            return np.zeros(len(ids), np.float32)
        return np.where(known, vectors @ vector, 0.0).astype(np.float32)


def user_inputs(
    towers: Towers, extractor: FeatureExtractor, rows: Sequence[FeatureRow], pull: Pull
) -> npt.NDArray[np.float32]:
    """The user tower's input for ``rows``, ``(len(rows), width)``: each user column's tower
    rows pulled and pooled (what a request feeds the tower; ``vidrec export-vectors`` too)."""
    batch = extractor.extract(list(rows), wide=False)  # the towers read no wide part
    read = pull.many({tower_table(table): keys for table, keys in batch.table_keys.items()})
    pulled = {table: read[tower_table(table)] for table in batch.table_keys}
    return pool(towers.user, batch, pulled)


def towers_of(manifest: Manifest, schema: FeatureSchema) -> Towers | None:
    """The towers a version's manifest describes, over this schema (None: no towers)."""
    described = manifest.extra.get(MANIFEST_KEY)
    if not described:
        return None
    return Towers.from_settings(schema, RetrievalSettings(
        user_columns=tuple(described["user_columns"]),
        video_columns=tuple(described["video_columns"]),
        table_dim=int(described["table_dim"]),
        dim=int(described["dim"]),
    ))


class RetrievalLoadError(VidrecError):
    """A version's towers that cannot be served (the ranker still is)."""

    http_status = 503


def load_retrieval(
    registry: ModelRegistry,
    manifest: Manifest,
    schema: FeatureSchema,
    options: ort.SessionOptions,
    ann: AnnSettings | None = None,
    ann_dir: Path | None = None,
    query: str = "user",
) -> RetrievalModel | None:
    """The towers of ``manifest``'s version; None when it has none.

    The towers are rebuilt from the manifest's description against this
    server's schema (whose hash the ranker already checked), so columns it
    does not embed are refused here. The index over the video vectors is
    built here (or restored from ``ann_dir`` when it holds this version's).
    """
    if not manifest.extra.get(MANIFEST_KEY):
        return None
    version = manifest.version
    try:
        towers = towers_of(manifest, schema)
        assert towers is not None
        paths = {
            name: registry.artifact_path(version, name)
            for name in (USER_TOWER_FILE, VIDEO_VECTORS_FILE, VIDEO_IDS_FILE)
        }
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            raise RetrievalLoadError(f"version {version}: towers without {missing}")
        session = ort.InferenceSession(
            str(paths[USER_TOWER_FILE]), sess_options=options, providers=["CPUExecutionProvider"]
        )
        vectors = np.load(paths[VIDEO_VECTORS_FILE])  # type: ignore[arg-type]
        ids = (paths[VIDEO_IDS_FILE]).read_text().split("\n")  # type: ignore[union-attr]
        ids = [i for i in ids if i]
        if vectors.ndim != 2 or vectors.shape[1] != towers.dim:
            raise RetrievalLoadError(
                f"version {version}: video vectors {vectors.shape}, expected (N, {towers.dim})"
            )
        index = LiveIndex(ann or AnnSettings(), directory=ann_dir)
        index.publish(ids, vectors, version=version, wait=True)
        if index.index is None or index.index.version != version:
            raise RetrievalLoadError(f"version {version}: index: {index.last_error}")
    except RetrievalLoadError:
        raise
    except Exception as exc:  # onnxruntime, numpy and pydantic raise their own types
        raise RetrievalLoadError(f"version {version}: cannot load the towers: {exc}") from exc
    return RetrievalModel(version, towers, session, index, query)
