"""The Wide&Deep module: shapes, padding, and ONNX parity with torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from feature_store.features.columns import MultiValued
from feature_store.features.schema import default_schema
from feature_store.models import model_io
from trainer.export import example_inputs, export_onnx
from trainer.model import WideDeep

SCHEMA = default_schema()


def test_forward_gives_one_probability_per_row() -> None:
    torch.manual_seed(0)
    model = WideDeep(SCHEMA)
    inputs = example_inputs(SCHEMA, 33, np.random.default_rng(1))
    score = model(*inputs)
    assert score.shape == (33,)
    assert bool(((score > 0) & (score < 1)).all())


def test_padding_pools_to_nothing() -> None:
    """A history padded with index N_t scores like the same history without the padding rows."""
    torch.manual_seed(0)
    model = WideDeep(SCHEMA).eval()
    rng = np.random.default_rng(2)
    inputs = example_inputs(SCHEMA, 4, rng, rows_per_table=5, wide_rows=7)
    names = model_io.input_names(SCHEMA)
    pos = names.index(model_io.index_input("history"))
    history_len = next(c for c in SCHEMA.embedded if c.name == "history")
    assert isinstance(history_len, MultiValued)
    idx = torch.full((4, history_len.max_len), 5, dtype=torch.int64)  # all padding
    idx[:, 0] = 1  # one real row per user
    inputs[pos] = idx
    one_real = model(*inputs)
    idx2 = idx.clone()
    idx2[:, 1] = 1  # the same row twice: the mean is unchanged
    inputs[pos] = idx2
    assert torch.allclose(model(*inputs), one_real, atol=1e-6)


def test_gradients_reach_pulled_rows_and_wide_weights() -> None:
    model = WideDeep(SCHEMA)
    inputs = example_inputs(SCHEMA, 8, np.random.default_rng(3))
    for i, name in enumerate(model_io.input_names(SCHEMA)):
        if name.startswith("emb__") or name == model_io.WIDE_WEIGHTS:
            inputs[i].requires_grad_(True)
    model.logits(*inputs).sum().backward()
    names = model_io.input_names(SCHEMA)
    wide = inputs[names.index(model_io.WIDE_WEIGHTS)]
    assert wide.grad is not None and wide.grad.abs().sum() > 0
    user = inputs[names.index(model_io.embedding_input("user"))]
    assert user.grad is not None and user.grad.shape == user.shape


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_onnx_matches_torch_on_random_batches(tmp_path: Path, exporter: str) -> None:
    torch.manual_seed(4)
    model = WideDeep(SCHEMA).eval()
    path = tmp_path / "model.onnx"
    export_onnx(model, SCHEMA, path, exporter)  # type: ignore[arg-type]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == model_io.input_names(SCHEMA)
    assert [o.name for o in session.get_outputs()] == model_io.OUTPUT_NAMES
    rng = np.random.default_rng(5)
    for batch in (1, 7, 256, 1024):
        inputs = example_inputs(SCHEMA, batch, rng)
        feed = {n: t.numpy() for n, t in zip(model_io.input_names(SCHEMA), inputs, strict=True)}
        outputs = session.run(None, feed)
        with torch.no_grad():
            torch_heads = model.heads(*inputs).numpy()
            torch_score = model(*inputs).numpy()
        for i, head in enumerate(model_io.HEADS):  # every head, by its output name
            onnx_head = outputs[model_io.OUTPUT_NAMES.index(model_io.HEAD_OUTPUTS[head])]
            assert onnx_head.shape == (batch,), head
            np.testing.assert_allclose(onnx_head, torch_heads[:, i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(outputs[0], torch_score, rtol=0, atol=1e-5)  # score: engagement


def test_request_form_of_attention_matches_training_form() -> None:
    """The exported copy's attention (every candidate against every sequence, the others
    masked) gives the training form's scores on request-shaped inputs: 2 sequences (a
    user and the cold start's anonymous rows), many candidates, one of them all padding."""
    torch.manual_seed(6)
    model = WideDeep(SCHEMA).eval()
    inputs = example_inputs(SCHEMA, 300, np.random.default_rng(7), rows_per_table=40)
    names = model_io.input_names(SCHEMA)
    for col in SCHEMA.embedded:
        if model_io.per_request(col):
            pos = names.index(model_io.index_input(col.name))
            inputs[pos] = inputs[pos][:2].clone()
            inputs[pos][1] = 40  # the anonymous user: no history at all
    sequence_row = torch.zeros(300, dtype=torch.int64)
    sequence_row[150:] = 1
    inputs[names.index(model_io.SEQUENCE_ROWS)] = sequence_row
    with torch.no_grad():
        training_form = model.heads(*inputs)
        request_form = model.for_requests().heads(*inputs)
    torch.testing.assert_close(request_form, training_form, rtol=0, atol=1e-6)
