"""Loading exported models into ONNX Runtime, and swapping them while serving.

:func:`load_model` opens one registry version: checks its manifest against
the server's schema and sparse-table family, creates a session on the
preferred execution provider (CUDA when asked or ``auto`` and usable, else
CPU; the provider *actually* in use is what the session reports, because
onnxruntime-gpu quietly falls back to CPU when no GPU is present), and warms
every batch-size bucket so that no request pays for a first run.

:class:`ModelHolder` keeps the serving model and a background thread that
polls the registry's ``ACTIVE`` pointer. A new active version is loaded and
warmed on that thread, off the request path, then published by one reference
assignment (atomic in CPython): a request reads ``holder.current`` once and
scores with that :class:`LoadedModel` to the end, so in-flight requests
finish on the old version. A model carries the reader of its family's
sparse tables (:attr:`LoadedModel.pull`), so a version of another family
swaps the model and the tables it reads together. A version that fails to load is logged, counted,
and remembered (not retried until the pointer moves), and the old one keeps
serving.

A model's outputs are its ranking heads (:data:`feature_store.models.model_io.HEADS`);
:meth:`LoadedModel.run_heads` runs the ones it has. A version exported
before heads has the one output ``score`` (the engagement head's name) and
still loads and serves: its other heads are simply absent, and the fusion
(:mod:`app.scoring.fusion`) scores with engagement alone. A head the trainer
exported with fewer than ``api.min_head_samples`` training samples (the
manifest's ``head_samples``: a stream without plays never trains the watch
head) is left out the same way: an untrained head's output is noise from the
shared tower, not a prediction.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from app.cache import RowReader
from app.scoring.retrieval import RetrievalLoadError, RetrievalModel, load_retrieval
from app.scoring.sequence import SequenceLoadError, SequenceModel, load_sequence
from feature_store.errors import ConfigurationError, NotFound, VidrecError
from feature_store.features.extract import BatchFeatures
from feature_store.features.schema import FeatureSchema
from feature_store.heads import PRIMARY
from feature_store.models import model_io
from feature_store.models.registry import Manifest, ModelRegistry
from feature_store.runtime.worker import periodic
from feature_store.settings import AnnSettings, ApiSettings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class ModelLoadError(VidrecError):
    """A registry version that cannot be served (bad file, schema or family)."""

    http_status = 503


@dataclass
class LoadedModel:
    """One warmed ONNX session and what it is."""

    version: str
    manifest: Manifest
    session: ort.InferenceSession
    provider: str
    """Execution provider in use, e.g. ``CPUExecutionProvider``."""
    buckets: tuple[int, ...]
    loaded_at_ms: int
    load_seconds: float
    warmup_seconds: float
    input_names: list[str] = field(default_factory=list)
    heads: tuple[str, ...] = (model_io.SCORE_HEAD,)
    """The ranking heads this version outputs (HEADS order); engagement alone for a
    version exported before heads."""
    pull: RowReader | None = None
    """Row reader of the version's family's sparse tables (None: the scorer's own).

    Held by the model so that a swap to another family replaces the model and
    the tables it reads in one assignment: a request never mixes them."""
    retrieval: RetrievalModel | None = None
    """The version's two-tower model (None: the version has none, or towers are off):
    swapped with the ranker, so a request's user vector and video vectors match."""
    sequence: SequenceModel | None = None
    """The version's sequence tower (None: the version has none): swapped with the
    ranker, so a user's state and the video vectors come from one refit."""
    row_shaped: frozenset[str] = frozenset()
    """Inputs whose first axis is named ``B``: a version exported before the history was
    per sequence takes it per row (:func:`~feature_store.models.model_io.build_feed`)."""
    sequence_rows: bool = True
    """Whether the version takes ``seq_row`` (one exported before the history was per
    sequence, from a schema without attention, does not)."""

    def bucket(self, batch: int) -> int:
        """The warmed batch size a batch of ``batch`` rows is padded to."""
        for size in self.buckets:
            if size >= batch:
                return size
        return batch

    def run(self, feed: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        """Engagement scores of a feed (:func:`~feature_store.models.model_io.build_feed`)."""
        (scores,) = self.session.run([model_io.SCORE], feed)
        return np.asarray(scores, dtype=np.float32)

    def run_heads(self, feed: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[np.float32]]:
        """Every head this version has, by head name, in one run."""
        names = [model_io.HEAD_OUTPUTS[h] for h in self.heads]
        outputs = self.session.run(names, feed)
        return {
            h: np.asarray(o, dtype=np.float32) for h, o in zip(self.heads, outputs, strict=True)
        }


def pad_batch(batch: BatchFeatures, size: int) -> BatchFeatures:
    """``batch`` grown to ``size`` rows by repeating row 0 (its scores are discarded).

    Row 0's indices are valid for every input (including the wide part, which
    has no padding row), so the padded run computes nothing out of range. A
    sequence column with one row per sequence (fewer rows than the batch) is
    left as it is: the added rows read row 0's sequence.
    """
    extra = size - batch.batch_size
    if extra <= 0:
        return batch

    def grow(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.concatenate([array, np.repeat(array[:1], extra, axis=0)], axis=0)

    rows = batch.batch_size
    return BatchFeatures(
        size,
        batch.table_keys,
        {
            name: grow(idx) if len(idx) == rows else idx
            for name, idx in batch.column_indices.items()
        },
        batch.wide_keys,
        grow(batch.wide_indices),
        grow(batch.dense),
        None if batch.sequence_row is None else grow(batch.sequence_row),
    )


def session_options(settings: ApiSettings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: the CUDA fallback warning is reported by us
    return options


_cuda_usable: bool | None = None
"""Whether a CUDA session could be created in this process (None: not tried yet)."""


def provider_preference(preference: str) -> list[str]:
    """Providers to ask for, best first (``cuda`` still falls back to CPU).

    onnxruntime-gpu lists CUDA as available whenever its library is
    installed, GPU or not. ``auto`` does not ask for it on a machine without
    the NVIDIA driver (nothing for CUDA to use), and once a CUDA session
    failed it stops asking (each attempt logs a loud error); ``cuda`` always
    asks.
    """
    available = ort.get_available_providers()
    if preference == "cpu" or CUDA not in available:
        return [CPU]
    if preference == "auto" and (_cuda_usable is False or not nvidia_driver_present()):
        return [CPU]
    return [CUDA, CPU]


@functools.cache
def nvidia_driver_present() -> bool:
    """Whether the NVIDIA driver's CUDA library loads in this process."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def check_manifest(manifest: Manifest, schema: FeatureSchema, family: str) -> None:
    """Refuse a version whose keys would not mean what this server computes."""
    if manifest.schema_hash != schema.schema_hash():
        raise ModelLoadError(
            f"version {manifest.version}: schema_hash {manifest.schema_hash} != "
            f"server's {schema.schema_hash()}"
        )
    if manifest.family != family:
        raise ModelLoadError(
            f"version {manifest.version}: family {manifest.family!r} but this server reads "
            f"the sparse tables of {family!r}"
        )


def load_model(
    registry: ModelRegistry,
    version: str,
    schema: FeatureSchema,
    family: str,
    settings: ApiSettings,
    warm: Callable[[LoadedModel, int], None],
    pull: RowReader | None = None,
    retrieval: bool = True,
    ann: AnnSettings | None = None,
    ann_dir: Path | None = None,
    retrieval_query: str = "user",
) -> LoadedModel:
    """Open ``version`` and warm every bucket with ``warm(model, batch_size)``.

    ``family`` is the family whose tables ``pull`` reads (the scorer's own
    tables when ``pull`` is None); a version of another family is refused.
    With ``retrieval``, the version's towers are loaded too (searched with
    ``retrieval_query``, see ``RetrievalSettings.query``); towers that fail
    to load are logged and the version serves without them (the ranker is
    what the version is for). ``ann`` configures their video index, saved to
    and restored from ``ann_dir`` (None: built at every load, never saved).
    """
    started = time.perf_counter()
    try:
        manifest = registry.manifest(version)
        check_manifest(manifest, schema, family)
        path = registry.model_path(version)
        session = ort.InferenceSession(
            str(path),
            sess_options=session_options(settings),
            providers=provider_preference(settings.onnx_provider),
        )
    except (NotFound, ModelLoadError):
        raise
    except Exception as exc:  # onnxruntime raises its own unrelated types
        raise ModelLoadError(f"version {version}: cannot load: {exc}") from exc
    names, row_shaped = _inputs(session, schema, version)
    outputs = {o.name for o in session.get_outputs()}
    if model_io.SCORE not in outputs:
        raise ModelLoadError(f"version {version}: no {model_io.SCORE!r} output in {outputs}")
    heads = _trained_heads(
        manifest, tuple(h for h in model_io.HEADS if model_io.HEAD_OUTPUTS[h] in outputs),
        settings.min_head_samples,
    )
    provider = session.get_providers()[0]
    global _cuda_usable
    if CUDA in provider_preference(settings.onnx_provider):
        _cuda_usable = provider == CUDA
    if settings.onnx_provider == "cuda" and provider != CUDA:
        log.warning("CUDA execution provider requested but unusable; serving on %s", provider)
    loaded = LoadedModel(
        version=version,
        manifest=manifest,
        session=session,
        provider=provider,
        buckets=tuple(settings.batch_buckets),
        loaded_at_ms=int(time.time() * 1000),
        load_seconds=time.perf_counter() - started,
        warmup_seconds=0.0,
        input_names=names,
        heads=heads,
        pull=pull,
        row_shaped=row_shaped,
        sequence_rows=model_io.SEQUENCE_ROWS in names,
    )
    warm_started = time.perf_counter()
    try:
        for size in loaded.buckets:
            for _ in range(2):
                warm(loaded, size)
    except Exception as exc:
        raise ModelLoadError(f"version {version}: warm-up failed: {exc}") from exc
    loaded.warmup_seconds = time.perf_counter() - warm_started
    if retrieval:
        try:
            loaded.retrieval = load_retrieval(
                registry, manifest, schema, session_options(settings), ann, ann_dir,
                retrieval_query,
            )
        except RetrievalLoadError as exc:
            log.error("serving %s without its towers: %s", version, exc)
        try:
            loaded.sequence = load_sequence(registry, manifest, session_options(settings))
        except SequenceLoadError as exc:
            log.error("serving %s without its sequence tower: %s", version, exc)
    return loaded


def _inputs(
    session: ort.InferenceSession, schema: FeatureSchema, version: str
) -> tuple[list[str], frozenset[str]]:
    """The session's input names, checked against the schema's, and those whose first
    axis is the batch's (see :attr:`LoadedModel.row_shaped`). A version exported before
    the history was per sequence may lack ``seq_row``; nothing else may differ."""
    names = [i.name for i in session.get_inputs()]
    expected = model_io.input_names(schema)
    before_sequences = [n for n in expected if n != model_io.SEQUENCE_ROWS]
    if sorted(names) not in (sorted(expected), sorted(before_sequences)):
        raise ModelLoadError(f"version {version}: inputs {names} != expected {expected}")
    row_shaped = frozenset(i.name for i in session.get_inputs() if i.shape and i.shape[0] == "B")
    return names, row_shaped


def index_status(model: LoadedModel | None) -> dict[str, Any] | None:
    """The served version's video index for ``/v1/status`` and the dashboard (``kind``,
    ``size``, ``built_at`` in unix s, ``age_s``...); None when it has no towers."""
    if model is None or model.retrieval is None:
        return None
    return model.retrieval.index.status()


def _trained_heads(manifest: Manifest, heads: tuple[str, ...], least: int) -> tuple[str, ...]:
    """``heads`` less those the manifest says trained on fewer than ``least`` samples
    (the primary head always stays: it is the score a model without heads served)."""
    counts = manifest.extra.get("head_samples")
    if not isinstance(counts, dict):
        return heads
    kept = tuple(h for h in heads if h == PRIMARY.name or int(counts.get(h, 0)) >= least)
    if kept != heads:
        log.info("version %s: heads %s trained on fewer than %d samples, left out of the "
                 "fusion", manifest.version, sorted(set(heads) - set(kept)), least)
    return kept


class ModelHolder:
    """The serving model plus a thread that hot-swaps it (see the module docstring)."""

    def __init__(
        self,
        registry: ModelRegistry,
        loader: Callable[[str], LoadedModel],
        poll_interval_s: float,
        on_swap: Callable[[LoadedModel], None] | None = None,
        on_failure: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self.registry = registry
        self.loader = loader
        self.poll_interval_s = poll_interval_s
        self.on_swap = on_swap
        self.on_failure = on_failure
        self.current: LoadedModel | None = None
        """The model new requests use; read once per request."""
        self.failed: dict[str, str] = {}
        """Versions that failed to load, with the reason (not retried)."""
        self.last_error: str | None = None
        self._worker = periodic("vidrec-model-poll", lambda: self.poll_interval_s, self.poll_once)
        self._lock = threading.Lock()

    def poll_once(self) -> bool:
        """Load the active version if it is new; True when a swap happened."""
        with self._lock:
            try:
                active = self.registry.active()
            except OSError as exc:
                self.last_error = f"registry unreadable: {exc}"
                return False
            current = self.current
            if active is None or active in self.failed:
                return False
            if current is not None and current.version == active:
                return False
            try:
                loaded = self.loader(active)
            except (VidrecError, ConfigurationError) as exc:
                log.error(
                    "model %s failed to load; keeping %s: %s",
                    active,
                    current.version if current else None,
                    exc,
                )
                try:
                    if self.on_failure is not None:
                        self.on_failure(active, exc)
                finally:  # recorded last: whoever sees it recorded sees the callback's effect
                    self.failed[active] = str(exc)
                    self.last_error = str(exc)
                return False
            self.current = loaded
            self.last_error = None
            log.info(
                "serving model %s on %s (load %.3f s, warm-up %.3f s)",
                loaded.version,
                loaded.provider,
                loaded.load_seconds,
                loaded.warmup_seconds,
            )
            if self.on_swap is not None:
                self.on_swap(loaded)
            return True

    def start(self) -> None:
        """Load the active version now (if any), then keep polling in the background."""
        self.poll_once()
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()
