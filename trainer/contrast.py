"""Sampled negatives for the ranker: each chosen view against videos the user was not shown.

Why: a feed logs a few unwatched impressions per view (ml-100k's replay: one),
so the ranker sees few examples of what a user's view is preferred *to*; the
ranking it serves orders candidates for one user at one moment, which is what
a softmax over a view and some other videos trains directly. Measured on
ml-100k leave-one-out (``docs/benchmarks.md``, *Personal feeds*).

For each positive sample of a chosen event (play, finish, like, share: the
towers' positives, :data:`trainer.retrieval.CHOSEN`) the join stage draws
``k`` videos uniformly from those the trainer has seen in its stream so far
(:class:`VideoPool`, updated after the draw: a video exists for the sampler
once an earlier batch named it; never the view's own video) and featurises
each as shown to the same user, in the same context, at the view's moment,
from the stores' pre-batch state (:func:`trainer.samples.moment_rows`: point
in time like every other moment). The rank stage adds to the step's loss,
per view, ``weight * (logsumexp(s_view, s_1..s_k) - s_view)`` over the
engagement logits (:func:`softmax_loss`). It depends only on differences of
logits for one user and moment, so the global bias and the user's own terms
cancel: the probabilities stay calibrated by the cross-entropy on the real
samples. The drawn rows are not samples: no label, no prequential metrics,
no towers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from feature_store.activity.base import ActivityStore
from feature_store.catalog.base import CatalogStore
from feature_store.event_types import of_types
from feature_store.events import Event
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from trainer.labels import Sample

CHOSEN = of_types("chosen")
SHOWN = of_types("shows")
REDRAWS = 20
"""Draws of a positive's own video replaced before a batch goes without negatives."""


@dataclass
class Contrast:
    """A batch's drawn negatives: ``k`` rows per anchored positive, in anchor order."""

    anchors: npt.NDArray[np.int64]
    """``(P,)`` positions of the positives among the batch's samples."""
    values: npt.NDArray[np.uint64]
    """``(P * k, W)`` packed values of the drawn videos' moments."""
    k: int


class VideoPool:
    """The videos of the newest ``capacity`` impressions, a ring: a draw is uniform over
    impressions, so a video comes as often as it was shown. Not checkpointed: a restarted
    trainer refills it from the events it reads."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity = capacity
        self.rng = rng
        self.ids: list[str] = []
        self._next = 0
        """Where the next id goes once the ring is full."""

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, video_ids: Sequence[str]) -> None:
        for video in video_ids:
            if len(self.ids) < self.capacity:
                self.ids.append(video)
            else:
                self.ids[self._next] = video
                self._next = (self._next + 1) % self.capacity

    def draw(self, n: int, k: int, own: Sequence[str]) -> list[list[str]] | None:
        """``k`` videos for each of ``n`` positives, none its positive's ``own[i]``
        (with replacement; a draw of the own video is drawn again, up to ``REDRAWS``
        times); None when that kept failing (a pool of little else than that video)."""
        ids = self.ids
        picks = self.rng.integers(len(ids), size=(n, k)).tolist()
        out: list[list[str]] = []
        for row, video in zip(picks, own, strict=True):
            group = [ids[j] for j in row]
            for m, drawn in enumerate(group):
                tries = 0
                while drawn == video:
                    tries += 1
                    if tries > REDRAWS:
                        return None
                    drawn = ids[int(self.rng.integers(len(ids)))]
                group[m] = drawn
            out.append(group)
        return out


class Sampler:
    """Draws and featurises a batch's negatives (the join stage's, see the module doc)."""

    def __init__(
        self, extractor: FeatureExtractor, k: int, seed: int, capacity: int = 100_000
    ) -> None:
        self.extractor = extractor
        self.k = k
        self.pool = VideoPool(capacity, np.random.default_rng(seed))

    def draw(self, samples: Sequence[Sample]) -> tuple[list[int], list[list[str]]]:
        """Which samples get negatives (positives of chosen events) and their videos."""
        anchors = [
            i for i, s in enumerate(samples)
            if s.label == 1.0 and s.weight > 0 and s.event.type in CHOSEN
        ]
        if not anchors or not len(self.pool):
            return [], []
        own = [samples[i].event.video_id for i in anchors]
        videos = self.pool.draw(len(anchors), self.k, own)
        return (anchors, videos) if videos is not None else ([], [])

    def featurise(
        self,
        samples: Sequence[Sample],
        anchors: list[int],
        videos: list[list[str]],
        catalog: CatalogStore,
        activity: ActivityStore,
    ) -> Contrast | None:
        """The drawn videos' rows at their positives' moments, pre-batch state."""
        if not anchors:
            return None
        limit = self.extractor.schema.history_len
        users = list(dict.fromkeys(samples[i].event.user_id for i in anchors))
        histories = {
            u: tuple(h[:limit]) for u, h in zip(users, activity.histories(users), strict=True)
        }
        distinct = list(dict.fromkeys(v for group in videos for v in group))
        records = dict(zip(distinct, catalog.get_many(distinct), strict=True))
        stats = dict(zip(distinct, activity.video_stats(distinct), strict=True))
        rows = []
        for i, group in zip(anchors, videos, strict=True):
            sample = samples[i]
            event: Event = sample.event
            for video in group:
                rows.append(FeatureRow(
                    user_id=event.user_id, video_id=video, ts_ms=event.ts,
                    video=records[video], context=sample.context,
                    history=histories[event.user_id], stats=stats[video],
                ))
        packed = self.extractor.values(rows).packed
        return Contrast(np.asarray(anchors, np.int64), packed, self.k)

    def seen(self, events: Sequence[Event]) -> None:
        """The batch's impressions join the pool (after its draw)."""
        self.pool.add([e.video_id for e in events if e.type in SHOWN])


def softmax_loss(
    logits: Tensor, n_real: int, contrast: Contrast, weights: Tensor, scale: float
) -> Tensor:
    """``scale * sum_p weight_p * (logsumexp(s_p, s_p1..s_pk) - s_p)``: ``logits`` are the
    engagement head's over the real rows then the drawn ones (:class:`Contrast` order)."""
    anchors = torch.from_numpy(contrast.anchors)
    positive = logits[anchors]
    drawn = logits[n_real:].reshape(len(anchors), contrast.k)
    group = torch.cat([positive.unsqueeze(1), drawn], dim=1)
    per_view = torch.logsumexp(group, dim=1) - positive
    return scale * (per_view * weights[anchors]).sum()
