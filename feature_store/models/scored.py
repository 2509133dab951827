"""What a trainer hands an evaluation: scored samples and offline results.

``trainer.offline`` produces them and ``app.evaluation`` reads them, so the
types live here, in the contract both build on; the composition root
(``app.wiring``) hands the evaluation the trainer that produces them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass
class ScoredSamples:
    """Training samples with their labels, loss weights and predicted probabilities, aligned."""

    event_ids: list[str]
    """The event that carries each label (the trainer's ``Sample.event``)."""
    user_ids: list[str]
    video_ids: list[str]
    ts_ms: npt.NDArray[np.int64]
    labels: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]
    """Online: scored before the step that trains on them (prequential)."""

    @classmethod
    def concat(cls, parts: list[ScoredSamples]) -> ScoredSamples:
        """One set from several, in order."""
        return cls(
            event_ids=[i for p in parts for i in p.event_ids],
            user_ids=[i for p in parts for i in p.user_ids],
            video_ids=[i for p in parts for i in p.video_ids],
            ts_ms=np.concatenate([p.ts_ms for p in parts] or [np.zeros(0, np.int64)]),
            labels=np.concatenate([p.labels for p in parts] or [np.zeros(0)]),
            weights=np.concatenate([p.weights for p in parts] or [np.zeros(0)]),
            scores=np.concatenate([p.scores for p in parts] or [np.zeros(0)]),
        )

    def take(self, index: list[int]) -> ScoredSamples:
        """The samples at ``index``, in that order."""
        idx = np.asarray(index, dtype=np.int64)
        return ScoredSamples(
            event_ids=[self.event_ids[i] for i in index],
            user_ids=[self.user_ids[i] for i in index],
            video_ids=[self.video_ids[i] for i in index],
            ts_ms=self.ts_ms[idx], labels=self.labels[idx],
            weights=self.weights[idx], scores=self.scores[idx],
        )


@dataclass
class OfflineResult:
    """An offline-trained Wide&Deep: scores on the test rows and the epochs it ran."""

    test: ScoredSamples
    """Scores of the epoch with the best validation AUC."""
    epochs: list[dict[str, float]]
    """Per epoch: ``epoch``, ``train_loss``, ``valid_auc``, ``seconds``."""
    best_epoch: int
