"""Ranking heads: the one declaration of what the ranking model predicts.

The model's deep tower is shared; its last layer has one output per head, in
the order of :data:`HEADS`. Each head is one :class:`HeadSpec`, and every
module that must agree on the heads iterates over the list instead of
counting positions:

- the label policy (``trainer/labels.py``) asks each head for its label of an
  event, from the event type's declared meaning
  (:mod:`feature_store.event_types`) and its watch ratio (:class:`Outcome`);
  ``target`` says whether the label is trained as given or turned into its
  quantile within the video's duration bucket (``trainer/watch.py``);
- the training rows (``trainer/samples.py``) hold one label column per head,
  the model (``trainer/model.py``) one output row per head, initialised at
  ``prior_rate``; the step (``trainer/step.py``) sums each head's ``loss``,
  times its ``trainer.head_loss_weights`` entry (default ``loss_weight``);
- the prequential metrics (``trainer/metrics.py``), the dashboard and the
  evaluation report show each head's ``metric`` (:data:`METRIC_FIGURES`);
- the export (``trainer/export.py``) names each output ``output`` and the
  server (``app/scoring``) reads them by that name
  (:mod:`feature_store.models.model_io`);
- the served score fuses the heads (``app/scoring/fusion.py``) with
  ``api.ranking_weights``, whose default is each head's ``fusion_weight``;
  an experiment arm's weights name heads too (:data:`HEAD_NAMES`).

The first head is the *primary* one (``engagement``): the wide part and the
global bias add to it, its prequential figures are the trainer's ``auc`` and
``logloss``, its output keeps the name a single-output model gave its only
one (``score``), and a server always keeps it (a model exported before heads
has it alone).

A new head is one entry of :data:`HEADS` (its name, label, loss, metric,
weights and output name); a checkpoint of fewer heads restores with the new
rows fresh (``trainer/model.py``), and a server reads a version without the
head's output as one whose fusion leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from feature_store.event_types import Meaning

NAN = math.nan


class Outcome(NamedTuple):
    """What one labelled event says, as each head's label reads it."""

    meaning: Meaning
    """Its type's declared meaning (a timed-out impression: the impression's)."""
    valued: bool | None
    """Whether the user valued the video (:func:`feature_store.event_types.valued`;
    False for a timed-out impression); None: the event does not say."""
    ratio: float | None
    """The watch ratio of an event judged by its watch; None for every other."""


Loss = Literal["bce"]
"""``bce``: binary cross-entropy on the sigmoid of the head's logit, against a 0/1 or a
soft label in [0, 1], summed over the labelled samples."""
Metric = Literal["auc", "rank"]
"""``auc``: ROC AUC, its popularity baseline's and the positive rate (binary labels);
``rank``: Spearman rank correlation and mean absolute error, and their baselines (soft
labels)."""

METRIC_FIGURES: dict[Metric, tuple[str, ...]] = {
    "auc": ("auc", "baseline_auc", "rate", "samples"),
    "rank": ("spearman", "baseline_spearman", "mae", "baseline_mae", "samples"),
}
"""The figures of each metric, in the trainer's metrics point as ``{head}_{figure}``
(``negative_auc``, ``watch_spearman``...); the first two are the head's main figure and
its popularity baseline's."""


@dataclass(frozen=True)
class HeadSpec:
    """One ranking head (see the module docstring)."""

    name: str
    label: Callable[[Outcome], float]
    """The head's label of an event: in [0, 1], NaN where the event says nothing of it."""
    about: str
    """What it predicts, in a few words, for people (the dashboard and the report name the
    head by it)."""
    loss: Loss = "bce"
    metric: Metric = "auc"
    target: Literal["label", "watch_quantile"] = "label"
    """``watch_quantile``: the label (a watch ratio) is trained as its quantile among plays
    of videos of similar duration (``trainer/watch.py``), not as itself."""
    fusion_weight: float = 0.0
    """Default weight in ``api.ranking_weights`` (0: left out of the served score)."""
    loss_weight: float = 1.0
    """Default multiplier of its loss (``trainer.head_loss_weights``)."""
    output: str = ""
    """Name of its ONNX output (default: the head's name)."""
    prior_rate: float | None = None
    """Probability its output starts at (its bias set to the log-odds); None: the layer's
    initialisation. For a rare label, so the first steps do not spend themselves
    unlearning a 50% start."""

    @property
    def output_name(self) -> str:
        return self.output or self.name

    def figures(self) -> tuple[str, ...]:
        """Its keys in the trainer's metrics point (``{name}_{figure}``)."""
        return tuple(f"{self.name}_{figure}" for figure in METRIC_FIGURES[self.metric])


def _engagement(o: Outcome) -> float:
    """1 if the user valued the video, 0 if not (a timed-out impression too)."""
    return NAN if o.valued is None else float(o.valued)


def _watch(o: Outcome) -> float:
    """The watch ratio of an event judged by its watch (a play with a duration)."""
    return NAN if o.ratio is None else o.ratio


def _negative(o: Outcome) -> float:
    """1 for an explicit negative (skip, dislike); 0 for every other labelled event."""
    return 1.0 if o.meaning.verdict == "negative" else 0.0


HEADS: tuple[HeadSpec, ...] = (
    HeadSpec("engagement", _engagement, "engagement", fusion_weight=1.0, output="score"),
    HeadSpec("watch", _watch, "watch quantile", metric="rank", target="watch_quantile"),
    HeadSpec("negative", _negative, "negative (skip, dislike)", prior_rate=0.05),
)
"""Every ranking head, in the order of the model's outputs; the first is the primary."""

PRIMARY = HEADS[0]
HEAD_NAMES: tuple[str, ...] = tuple(h.name for h in HEADS)
HEAD_BY_NAME: dict[str, HeadSpec] = {h.name: h for h in HEADS}


def _check() -> None:
    if len(HEAD_BY_NAME) != len(HEADS):
        raise ValueError(f"ranking heads {HEAD_NAMES} repeat a name")
    outputs = [h.output_name for h in HEADS]
    if len(set(outputs)) != len(outputs):
        raise ValueError(f"ranking heads' outputs {outputs} repeat a name")


_check()
