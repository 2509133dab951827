"""Sampled negatives (trainer/contrast.py): what is drawn, the softmax term, and a step
that trains it without changing what the step reports about the real samples."""

from __future__ import annotations

import numpy as np
import torch

from feature_store.features.columns import FeatureRow
from feature_store.features.schema import default_schema
from feature_store.runtime.resources import table_specs
from feature_store.settings import Settings
from feature_store.sparse.memory import MemorySparseTable
from trainer.contrast import Contrast, VideoPool, softmax_loss
from trainer.model import WideDeep
from trainer.step import Trainer

TS = 1_700_000_000_000


def test_pool_draws_as_often_as_shown_never_the_positives_own() -> None:
    pool = VideoPool(100, np.random.default_rng(0))
    pool.add(["a", "b", "b", "b", "c"])
    groups = pool.draw(2000, 5, ["a"] * 2000)
    assert groups is not None and all(len(g) == 5 for g in groups)
    drawn = [v for g in groups for v in g]
    assert set(drawn) == {"b", "c"}
    assert 2.5 < drawn.count("b") / drawn.count("c") < 3.5  # shown three times as often


def test_pool_keeps_the_newest_impressions() -> None:
    pool = VideoPool(10, np.random.default_rng(0))
    pool.add([f"v{i}" for i in range(50)])
    assert sorted(pool.ids) == sorted(f"v{i}" for i in range(40, 50))
    only = VideoPool(10, np.random.default_rng(0))
    only.add(["a"] * 5)
    assert only.draw(3, 2, ["a"] * 3) is None  # nothing else was shown


def test_softmax_loss_is_the_views_negative_log_softmax() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0, 1.0, 3.0, -2.0])  # 3 real rows, 2 x 2 drawn
    contrast = Contrast(np.array([0, 2]), np.zeros((4, 1), np.uint64), 2)
    weights = torch.tensor([1.0, 1.0, 0.5])
    loss = softmax_loss(logits, 3, contrast, weights, 2.0)
    first = torch.logsumexp(torch.tensor([2.0, 0.0, 1.0]), 0) - 2.0
    second = torch.logsumexp(torch.tensor([0.5, 3.0, -2.0]), 0) - 0.5
    assert torch.isclose(loss, 2.0 * (first + 0.5 * second))
    # A shift of every logit (the bias, the user's own terms) leaves it unchanged.
    assert torch.isclose(softmax_loss(logits + 7.0, 3, contrast, weights, 2.0), loss)


def _trainer() -> Trainer:
    settings = Settings()
    schema = default_schema(settings.features)
    tables = {
        spec.name: MemorySparseTable(spec, settings.sparse)
        for spec in table_specs(schema, settings)
    }
    torch.manual_seed(0)
    return Trainer(schema, tables, WideDeep(schema, (16,)), 0.01)


def test_step_trains_the_view_above_its_drawn_videos() -> None:
    trainer = _trainer()
    real = [FeatureRow(user_id=f"u{i}", video_id="liked", ts_ms=TS) for i in range(4)]
    drawn = [
        FeatureRow(user_id=f"u{i}", video_id=f"other{j}", ts_ms=TS)
        for i in range(4) for j in range(3)
    ]
    values = trainer.extractor.values(real + drawn)
    contrast = Contrast(np.arange(4), values.packed[4:], 3)
    labels = np.ones(4, np.float32)
    weights = np.ones(4, np.float32)
    first = trainer.step(values.to_batch(), labels, weights, contrast)
    assert first.scores.shape == (4,) and first.heads is not None and len(first.heads) == 4
    for _ in range(30):
        trainer.step(values.to_batch(), labels, weights, contrast)
    scores = trainer.score(values.to_batch())
    assert scores[:4].min() > scores[4:].max()
