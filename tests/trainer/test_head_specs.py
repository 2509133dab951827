"""Heads as data: every reader of the ranking heads follows feature_store/heads.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from feature_store.event_types import MEANINGS, EventType
from feature_store.experiments import Arm
from feature_store.features.schema import default_schema
from feature_store.features.values import layout_of
from feature_store.heads import HEAD_NAMES, HEADS, PRIMARY, Outcome
from feature_store.models.model_io import HEAD_OUTPUTS, OUTPUT_NAMES, SCORE
from feature_store.settings import ApiSettings, FeatureSettings, TrainerSettings
from tests.factories import make_event
from trainer.labels import Joiner, LabelPolicy, Moments
from trainer.metrics import TrainerMetrics
from trainer.samples import labelled_rows


def test_outputs_and_defaults_come_from_the_specs() -> None:
    assert OUTPUT_NAMES == [h.output_name for h in HEADS]
    assert HEAD_OUTPUTS[PRIMARY.name] == SCORE == "score"  # what every server reads
    assert ApiSettings().ranking_weights == {h.name: h.fusion_weight for h in HEADS
                                             if h.fusion_weight}
    assert TrainerSettings().head_loss_weights == {h.name: h.loss_weight for h in HEADS}


def test_a_weight_for_an_unknown_head_names_the_heads() -> None:
    with pytest.raises(ValueError, match="no ranking head 'clicks'") as found:
        Arm(name="a", family="main", fusion={"clicks": 1.0})
    assert all(name in str(found.value) for name in HEAD_NAMES)


def test_metrics_point_holds_each_heads_declared_figures() -> None:
    keys = set(TrainerMetrics(100).head_window())
    assert keys == {key for h in HEADS[1:] for key in h.figures()}


def test_each_head_labels_from_the_event_meaning() -> None:
    skip = Outcome(MEANINGS[EventType.SKIP], False, None)
    label = {h.name: h.label(skip) for h in HEADS}
    assert (label["engagement"], label["negative"]) == (0.0, 1.0)
    assert math.isnan(label["watch"])


def test_training_rows_have_a_column_per_head() -> None:
    layout = layout_of(default_schema())
    joiner = Joiner(LabelPolicy(TrainerSettings(), FeatureSettings()), 60_000, 100)
    events = [make_event(type="skip"), make_event(type="click", video_id="v2")]

    def featurise(positions: list[int]) -> Moments:
        return Moments(
            np.zeros((len(positions), layout.width), np.uint64), np.full(len(positions), np.nan)
        )

    (skip,) = joiner.observe(events, [0] * len(events), {}, featurise)
    assert (skip.head("engagement"), skip.head("negative")) == (0.0, 1.0)
    rows = labelled_rows([skip], layout)
    assert rows.targets.shape == (1, len(HEADS))
    np.testing.assert_array_equal(rows.targets[0], [skip.head(name) for name in HEAD_NAMES])
