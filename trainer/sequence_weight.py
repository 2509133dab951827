"""How much the ranking should trust the sequence tower: a weight learnt from the stream.

Why learnt: the tower's worth beside the ranker depends on the data. On
ml-100k's leave-one-out questions the best fixed weight of its term was about
1.0 (+0.037 HR@10); on a generated log whose views carry no order beyond the
users' tastes any weight above 0 lost to the ranker alone (0.8152 at 0, 0.7402
at 1.0; ``bench/screen_loo.py`` on both, ``docs/benchmarks.md``). So the
trainer measures it, point in time, on the samples it labels anyway:

- each labelled sample (a view, or an impression that timed out) is kept with
  the ranker's prequential score of its moment (``Sample.score``: made before
  the model trained on it) and the user's views before it (codes);
- when a refit is published, the samples kept since the previous one are
  scored by the previous tower (the one serving while they happened: it never
  trained on them), and a logistic regression ``label ~ a + b * logit(p) + c *
  tower logit`` is fit to them; the weight is ``c / b`` (the tower's logit in
  units of the ranker's log-odds, the scale the ranking adds it on; a ranker
  that tells nothing, ``b <= 0``, leaves the tower's evidence alone), clipped
  to ``[0, MAX_WEIGHT]``, averaged over refits.

A tower that adds nothing the ranker does not know gets ``c`` near 0 and the
term fades; the service multiplies it by ``api.sequence_weight`` (1.0: as
learnt).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from feature_store.models.sequence_io import left_padded
from trainer.sequence import SequenceTower

KEPT = 4096
"""Samples kept between two refits at most (the newest)."""
MIN_SAMPLES = 200
"""Fewer samples than this (or only one label) leave the weight as it was."""
MAX_WEIGHT = 3.0
SMOOTHING = 0.5
"""Share of a new estimate in the running weight (the rest: the previous weight)."""
RIDGE = 1e-3


@dataclass(frozen=True)
class Kept:
    """One labelled sample for the weight: the user's views before it, its video's code,
    its label (0/1) and the ranker's prequential log-odds."""

    views: tuple[int, ...]
    code: int
    label: float
    ranker_logit: float


class FusionWeight:
    """The samples since the last refit, and the running weight (see the module doc)."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.kept: deque[Kept] = deque(maxlen=KEPT)
        self.weight = 0.0
        """0 until a published tower has been measured: an unmeasured term stays out."""
        self.last: dict[str, float] = {}
        """The last fit's figures (samples, coefficients), for the trainer's status."""

    def keep(self, views: Sequence[int], code: int, label: float, score: float) -> None:
        """One labelled sample (``score``: the ranker's probability at its moment)."""
        if not views or not code or not 0.0 < score < 1.0 or math.isnan(score):
            return
        self.kept.append(Kept(tuple(views[-self.max_len:]), code,
                              1.0 if label > 0 else 0.0, math.log(score / (1.0 - score))))

    def take(self) -> list[Kept]:
        """The samples kept so far, forgotten here (the caller holds the views' lock)."""
        kept, self.kept = list(self.kept), deque(maxlen=KEPT)
        return kept

    def update(self, tower: SequenceTower | None, kept: Sequence[Kept]) -> float:
        """Measure ``tower`` (the one that served while the ``kept`` samples happened) on
        them and fold the estimate into the weight; the weight."""
        if tower is None:
            return self.weight
        known = tower.item.weight.shape[0] - 1  # videos coded after its refit: unknown to it
        rows = [Kept(tuple(c for c in k.views if c <= known), k.code, k.label, k.ranker_logit)
                for k in kept if k.code <= known]
        rows = [k for k in rows if k.views]
        labels = np.array([k.label for k in rows])
        if len(rows) < MIN_SAMPLES or labels.min() == labels.max():
            return self.weight
        logits = tower_logits(tower, rows, self.max_len)
        ranker = np.array([k.ranker_logit for k in rows])
        b = logistic(np.column_stack([np.ones(len(rows)), ranker, logits]), labels)
        # A ranker that tells nothing here (b <= 0): the tower's evidence alone decides.
        estimate = float(np.clip(b[2] / max(b[1], 1e-3), 0.0, MAX_WEIGHT))
        self.weight = (1 - SMOOTHING) * self.weight + SMOOTHING * estimate
        self.last = {"samples": len(rows), "ranker_coef": round(float(b[1]), 4),
                     "tower_coef": round(float(b[2]), 4), "estimate": round(estimate, 4)}
        return self.weight


@torch.no_grad()
def tower_logits(tower: SequenceTower, rows: Sequence[Kept], max_len: int
                 ) -> npt.NDArray[np.float64]:
    """Each kept sample's video logit after the user's views, by ``tower``."""
    out = np.empty(len(rows))
    for start in range(0, len(rows), 512):
        chunk = rows[start:start + 512]
        codes = torch.from_numpy(left_padded([k.views for k in chunk], max_len))
        states = tower.last_state(codes)
        items = tower.item.weight[torch.tensor([k.code for k in chunk])]
        out[start:start + len(chunk)] = (states * items).sum(-1).double().numpy()
    return out


def logistic(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64],
             iterations: int = 25) -> npt.NDArray[np.float64]:
    """Coefficients of a logistic regression of ``y`` on ``x`` (Newton's method, a small
    ridge so that a separable sample stays finite)."""
    b = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ b, -30, 30)))
        gradient = x.T @ (y - p) - RIDGE * b
        hessian = (x * (p * (1 - p))[:, None]).T @ x + RIDGE * np.eye(x.shape[1])
        step = np.linalg.solve(hessian, gradient)
        b = b + step
        if np.abs(step).max() < 1e-8:
            break
    return b
