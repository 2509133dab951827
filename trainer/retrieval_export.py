"""Writing the towers into a registry version (see :mod:`feature_store.models.retrieval_io`).

At each export: the user tower's MLP to ONNX (the service pools the rows
itself, so the graph takes the pooled vector and stays tiny), and every
visible catalog video's vector, computed by the video tower over the
catalog's features in chunks. A video uploaded after the export has no
vector until the next one: it still reaches users through the other sources.
The videos' features (not their vectors) are kept from one export to the next
(:class:`VideoInputs`): they depend on the catalog record alone.
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from feature_store.catalog.base import Video
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import FeatureSchema
from feature_store.features.values import FeatureValues
from feature_store.models.retrieval_io import (
    POOLED,
    USER_TOWER_FILE,
    VECTOR,
    VIDEO_IDS_FILE,
    VIDEO_VECTORS_FILE,
    EmbeddedColumn,
    Towers,
)
from trainer.export import ONNX_EXPORT_LOCK
from trainer.retrieval import RetrievalTrainer, Tower

CHUNK = 4096
"""Catalog videos per video-tower pass (bounds the export's memory)."""
OPSET = 17


def export_user_tower(tower: Tower, width: int, path: Path) -> None:
    """The user tower's MLP and normalisation as ONNX (``pooled`` -> ``vector``)."""
    tower = copy.deepcopy(tower).eval()
    example = torch.zeros(2, width)
    with ONNX_EXPORT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            tower,
            (example,),
            str(path),
            input_names=[POOLED],
            output_names=[VECTOR],
            dynamic_axes={POOLED: {0: "B"}, VECTOR: {0: "B"}},
            opset_version=OPSET,
            dynamo=False,
        )


def _row(video: Video) -> FeatureRow:
    """A video alone, as the video tower reads it (no user, no moment, no counters)."""
    return FeatureRow(user_id="", video_id=video.video_id, ts_ms=0, video=video)


class VideoInputs:
    """The video tower's inputs (packed feature values) of the visible catalog, kept
    from one export to the next.

    Featurising a video (its row, the title's tokens, hashing every key) costs
    about 45 us of CPU (0.9 s of a 19,000-video export, ``bench/bench_export.py``)
    and depends on the :class:`Video` record alone, which rarely changes between
    exports; the tower's weights, which change, are applied after. So the values
    are kept per video, keyed by the record itself (a frozen model, hashed and
    compared by every field): a changed video is another key and is featurised
    afresh; a hidden or removed one is dropped at the next export, which keeps
    exactly the videos it was given. Equal records always give equal values, so
    the vectors are those of a fresh extraction.

    Memory: ``8 * width`` bytes per visible video (the video columns' layout,
    30 slots for the default settings), beside the records it keys by.
    """

    def __init__(self, columns: Sequence[EmbeddedColumn]) -> None:
        self.columns = tuple(columns)
        self.extractor = FeatureExtractor(FeatureSchema(columns=self.columns))
        self.layout = self.extractor.layout
        self._lock = threading.Lock()  # one extractor, one state: one export at a time
        self._where: dict[Video, int] = {}
        """Each kept video's row in ``_packed``."""
        self._packed = np.zeros((0, self.layout.width), np.uint64)
        self.extracted = 0
        """Videos featurised so far (the misses; for tests and the bench)."""

    def values(self, videos: Iterable[Video]) -> tuple[list[str], FeatureValues]:
        """Ids and feature values of the visible ``videos``, in their order."""
        visible = [v for v in videos if not v.hidden]
        with self._lock:
            known = self._where
            where = np.fromiter((known.get(v, -1) for v in visible), np.int64, len(visible))
            packed = np.empty((len(visible), self.layout.width), np.uint64)
            hit = where >= 0
            packed[hit] = self._packed[where[hit]]
            missing = np.flatnonzero(~hit)
            for start in range(0, len(missing), CHUNK):
                part = missing[start : start + CHUNK]
                packed[part] = self.extractor.values([_row(visible[i]) for i in part]).packed
            self.extracted += len(missing)
            self._where = {v: i for i, v in enumerate(visible)}
            self._packed = packed
        return [v.video_id for v in visible], FeatureValues(self.layout, packed)


def video_vectors(
    retrieval: RetrievalTrainer, videos: Iterable[Video], inputs: VideoInputs | None = None
) -> tuple[list[str], npt.NDArray[np.float32]]:
    """Ids and vectors of the visible ``videos``, by the towers' current weights.

    ``inputs`` keeps the featurised videos across calls (:class:`VideoInputs`); without
    it every video is featurised afresh.
    """
    if inputs is None:
        inputs = VideoInputs(retrieval.towers.video)
    elif inputs.columns != tuple(retrieval.towers.video):
        raise ValueError("the video inputs were made for other video columns")
    ids, values = inputs.values(videos)
    layout, packed = values.layout, values.packed
    parts = [
        retrieval.video_vectors(FeatureValues(layout, packed[start : start + CHUNK]).to_batch())
        for start in range(0, len(ids), CHUNK)
    ]
    dim = retrieval.towers.dim
    vectors = np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
    return ids, vectors.astype(np.float32, copy=False)


def writer(
    retrieval: RetrievalTrainer, videos: Iterable[Video], inputs: VideoInputs | None = None
) -> Callable[[Path], None]:
    """Writes the towers' artifacts into a version's directory (for ``registry.publish``);
    ``inputs`` as in :func:`video_vectors`."""
    towers: Towers = retrieval.towers

    def write(directory: Path) -> None:
        width = towers.width(towers.user)
        export_user_tower(retrieval.model.user, width, directory / USER_TOWER_FILE)
        ids, vectors = video_vectors(retrieval, videos, inputs)
        np.save(directory / VIDEO_VECTORS_FILE, vectors)
        (directory / VIDEO_IDS_FILE).write_text("".join(i + "\n" for i in ids))

    return write
