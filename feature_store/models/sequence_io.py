"""The sequence tower's contract shared by the trainer and the service.

A version with a sequence tower carries, beside ``model.onnx``:

- ``sequence.onnx``: input ``codes`` ``(B, max_len)`` int64, each row a user's
  newest positive views as item codes, oldest first, **left-padded** with 0
  (code ``i`` is line ``i`` of ``sequence_ids.txt``, 1-based); output
  ``state`` ``(B, dim)`` float32, the causal transformer's state at the last
  position (the newest view);
- ``sequence_items.npy`` ``(N, dim)`` float32: row ``i - 1`` is code ``i``'s
  vector (the tower's tied item embedding), so a video's logit for a user is
  ``items[code - 1] @ state``;
- ``sequence_ids.txt``: N lines, the video of each code.

The manifest's ``extra["sequence"]`` holds ``max_len``, ``dim``, how many
refits the weights had and the ranking's learnt ``weight`` of the tower's
logit (:func:`describe`, ``trainer/sequence_weight.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

ENCODER_FILE = "sequence.onnx"
ITEMS_FILE = "sequence_items.npy"
IDS_FILE = "sequence_ids.txt"
ARTIFACTS = (ENCODER_FILE, ITEMS_FILE, IDS_FILE)
"""The files a version with a sequence tower carries (listed in its manifest)."""
CODES = "codes"
"""The encoder's ONNX input."""
STATE = "state"
"""The encoder's ONNX output."""
MANIFEST_KEY = "sequence"
"""Key of :func:`describe` in a manifest's ``extra``."""
PAD = 0
"""The code of an empty slot (no video)."""


def describe(max_len: int, dim: int, fits: int, weight: float) -> dict[str, Any]:
    """What a manifest says of the version's sequence tower."""
    return {"max_len": max_len, "dim": dim, "fits": fits, "weight": weight}


def left_padded(rows: Sequence[Sequence[int]], length: int) -> npt.NDArray[np.int64]:
    """``(len(rows), length)`` codes: each row's newest ``length`` at the right, 0 before."""
    out = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        tail = list(row)[-length:]
        if tail:
            out[i, length - len(tail):] = tail
    return out
