"""The sequence tower at serving time: the user's state from their recent views, and
each candidate's logit (:mod:`feature_store.models.sequence_io`).

Loaded with a model version (:attr:`app.scoring.onnx_model.LoadedModel.sequence`;
None when the version has none). Per request: the user's positive history
entries, oldest first, as the version's item codes (a video the version
never coded is skipped), left-padded to ``max_len``; one run of the encoder;
then the candidates' item vectors dotted with the state. A candidate the
version has no vector for gets the median of the others' logits: no evidence
either way, so the other terms decide (a new video is the cold start's and
the exploration budget's business, not buried here).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from feature_store.activity.base import HistoryEntry
from feature_store.errors import VidrecError
from feature_store.models import sequence_io
from feature_store.models.registry import Manifest, ModelRegistry


class SequenceLoadError(VidrecError):
    """A version's sequence tower that cannot be served (the ranker still is)."""

    http_status = 503


class SequenceModel:
    """A version's sequence tower (see the module docstring). Thread-safe: ONNX
    Runtime sessions run concurrently, the arrays are read only."""

    def __init__(
        self, version: str, session: ort.InferenceSession, items: npt.NDArray[np.float32],
        ids: Sequence[str], max_len: int, weight: float = 1.0,
    ) -> None:
        self.version = version
        self.weight = weight
        """The ranking's learnt weight of the logit (``trainer/sequence_weight.py``), times
        ``api.sequence_weight``."""
        self.session = session
        self.items = items
        self.codes = {video: i + 1 for i, video in enumerate(ids)}
        self.max_len = max_len

    def user_codes(self, history: Sequence[HistoryEntry]) -> list[int]:
        """The user's positive views the version knows, oldest first (``history`` is
        newest first), the newest ``max_len``."""
        codes = self.codes
        known = [codes.get(h.video_id, 0) for h in history if h.positive]
        return [c for c in reversed(known) if c][-self.max_len:]

    def logits(
        self, history: Sequence[HistoryEntry], ids: Sequence[str]
    ) -> npt.NDArray[np.float64] | None:
        """Each candidate's logit for this user; None when the user has no known view
        (the term is then left out of the ranking)."""
        mine = self.user_codes(history)
        if not mine or not len(ids):
            return None
        feed = sequence_io.left_padded([mine], self.max_len)
        (state,) = self.session.run([sequence_io.STATE], {sequence_io.CODES: feed})
        rows = np.fromiter(map(self.codes.get, ids, repeat(0)), np.int64, len(ids))
        known = rows > 0
        if not known.any():
            return None
        out = np.empty(len(ids), np.float64)
        out[known] = self.items[rows[known] - 1] @ state[0]
        out[~known] = np.median(out[known])
        return out


def load_sequence(
    registry: ModelRegistry, manifest: Manifest, options: ort.SessionOptions
) -> SequenceModel | None:
    """The sequence tower of ``manifest``'s version; None when it has none."""
    described = manifest.extra.get(sequence_io.MANIFEST_KEY)
    if not described:
        return None
    version = manifest.version
    try:
        paths = {name: registry.artifact_path(version, name) for name in sequence_io.ARTIFACTS}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            raise SequenceLoadError(f"version {version}: sequence tower without {missing}")
        session = ort.InferenceSession(
            str(paths[sequence_io.ENCODER_FILE]), sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        items = np.load(paths[sequence_io.ITEMS_FILE])  # type: ignore[arg-type]
        text = paths[sequence_io.IDS_FILE].read_text()  # type: ignore[union-attr]
        ids = [i for i in text.split("\n") if i]
        dim = int(described["dim"])
        if items.ndim != 2 or items.shape != (len(ids), dim):
            raise SequenceLoadError(
                f"version {version}: sequence items {items.shape}, expected ({len(ids)}, {dim})"
            )
    except SequenceLoadError:
        raise
    except Exception as exc:  # onnxruntime and numpy raise their own types
        raise SequenceLoadError(f"version {version}: cannot load the sequence tower: {exc}"
                                ) from exc
    return SequenceModel(version, session, np.ascontiguousarray(items, np.float32), ids,
                         int(described["max_len"]), float(described.get("weight", 1.0)))
