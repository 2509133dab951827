"""Writing the sequence tower into a registry version (:mod:`feature_store.models.sequence_io`).

The encoder goes to ONNX with a fixed ``max_len`` (the service left-pads every
user's views to it: with left padding the newest view is always the last
position, exactly as in training's shorter windows), and the item vectors of
every coded video beside it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from feature_store.models.sequence_io import CODES, ENCODER_FILE, IDS_FILE, ITEMS_FILE, STATE
from trainer.export import ONNX_EXPORT_LOCK
from trainer.sequence import Encoder, Published

OPSET = 17


def export_encoder(published: Published, max_len: int, path: Path) -> None:
    """``codes`` ``(B, max_len)`` -> ``state`` ``(B, dim)`` as ONNX."""
    encoder = Encoder(published.tower).eval()
    example = torch.zeros(2, max_len, dtype=torch.long)
    example[:, -1] = 1
    with ONNX_EXPORT_LOCK, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            encoder, (example,), str(path), input_names=[CODES], output_names=[STATE],
            dynamic_axes={CODES: {0: "B"}, STATE: {0: "B"}}, opset_version=OPSET, dynamo=False,
        )


def writer(published: Published, max_len: int) -> Callable[[Path], None]:
    """Writes the tower's artifacts into a version's directory (for ``registry.publish``)."""

    def write(directory: Path) -> None:
        export_encoder(published, max_len, directory / ENCODER_FILE)
        items = published.tower.item.weight.detach()[1:len(published.ids) + 1]
        np.save(directory / ITEMS_FILE, items.numpy().astype(np.float32))
        (directory / IDS_FILE).write_text("".join(i + "\n" for i in published.ids))

    return write
