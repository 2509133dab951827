"""Writing the towers into a registry version (see :mod:`feature_store.models.retrieval_io`).

At each export: the user tower's MLP to ONNX (the service pools the rows
itself, so the graph takes the pooled vector and stays tiny), and every
visible catalog video's vector, computed by the video tower over the
catalog's features in chunks. A video uploaded after the export has no
vector until the next one: it still reaches users through the other sources.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from feature_store.catalog.base import Video
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import FeatureSchema
from feature_store.models.retrieval_io import (
    POOLED,
    USER_TOWER_FILE,
    VECTOR,
    VIDEO_IDS_FILE,
    VIDEO_VECTORS_FILE,
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


def video_vectors(
    retrieval: RetrievalTrainer, videos: Iterable[Video]
) -> tuple[list[str], npt.NDArray[np.float32]]:
    """Ids and vectors of the visible ``videos``."""
    extractor = FeatureExtractor(FeatureSchema(columns=retrieval.towers.video))
    ids: list[str] = []
    parts: list[npt.NDArray[np.float32]] = []
    chunk: list[FeatureRow] = []

    def flush() -> None:
        if chunk:
            parts.append(retrieval.video_vectors(extractor.extract(chunk)))
            chunk.clear()

    for video in videos:
        if video.hidden:
            continue
        ids.append(video.video_id)
        chunk.append(FeatureRow(user_id="", video_id=video.video_id, ts_ms=0, video=video))
        if len(chunk) >= CHUNK:
            flush()
    flush()
    dim = retrieval.towers.dim
    vectors = np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
    return ids, vectors.astype(np.float32, copy=False)


def writer(retrieval: RetrievalTrainer, videos: Iterable[Video]) -> Callable[[Path], None]:
    """Writes the towers' artifacts into a version's directory (for ``registry.publish``)."""
    towers: Towers = retrieval.towers

    def write(directory: Path) -> None:
        width = towers.width(towers.user)
        export_user_tower(retrieval.model.user, width, directory / USER_TOWER_FILE)
        ids, vectors = video_vectors(retrieval, videos)
        np.save(directory / VIDEO_VECTORS_FILE, vectors)
        (directory / VIDEO_IDS_FILE).write_text("".join(i + "\n" for i in ids))

    return write
