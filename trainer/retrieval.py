"""The two-tower retrieval model, trained online beside the ranker.

Each tower pools its columns' rows from the ``tt_*`` sparse tables
(:mod:`feature_store.models.retrieval_io`), runs a small MLP and L2-normalises: the
affinity of a user and a video is the cosine of their vectors. Training is
an in-batch softmax over the step's positives (each user's chosen video is
its positive, the other users' chosen videos its negatives), at
``temperature``.

**logQ correction.** In-batch negatives are sampled in proportion to
popularity, so an uncorrected softmax learns to push popular videos down
(they are negatives far more often than their share of positives would
justify). Each logit ``s(u, v)`` is replaced by ``s(u, v) - log q(v)``,
``q(v)`` the video's sampling probability, estimated on the stream by
:class:`FrequencyEstimate` (Yi et al., RecSys 2019: per hashed bucket, the
step ``v`` was last seen and a moving average of the steps between two
sightings; ``q = 1 / gap``). The same video twice in a batch is not its own
negative (masked off the diagonal).

Positives are the ranker's positive samples of chosen events (play,
finish, like, share: :attr:`feature_store.event_types.Meaning.chosen`), with
the feature values of their moment: the user side as it stood when the
video was shown, exactly what the ranker trains on
(:class:`trainer.labels.Sample`). :meth:`RetrievalTrainer.add` buffers
them and :meth:`RetrievalTrainer.step` trains a full batch; a step that
fails (a backend error) is skipped and counted, never retried: the ranker
owns the loop's retry, and the towers learn from the next batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from torch.nn import functional

from feature_store.event_types import of_types
from feature_store.features.batch import BatchFeatures
from feature_store.features.columns import MultiValued
from feature_store.features.values import FeatureValues, ValueLayout
from feature_store.models.retrieval_io import EmbeddedColumn, Towers, tower_table
from feature_store.settings import RetrievalSettings
from feature_store.sparse.base import SparseTable
from feature_store.sparse.steps import pull_many, push_many
from trainer.labels import Sample

log = logging.getLogger(__name__)

CHOSEN = of_types("chosen")
"""Event types whose positive samples are a user choosing a video (play, finish, like,
share: :attr:`~feature_store.event_types.Meaning.chosen`)."""
STATE_FILE = "retrieval.pt"
ARRAYS_FILE = "retrieval.npz"


class Tower(nn.Module):
    """Pooled rows of some columns -> MLP -> L2-normalised vector."""

    def __init__(
        self, columns: Sequence[EmbeddedColumn], tables: Sequence[str], towers: Towers,
        hidden: int,
    ) -> None:
        super().__init__()
        position = {t: i for i, t in enumerate(tables)}
        self.columns = [
            (c.name, position[c.table_name()], isinstance(c, MultiValued),
             isinstance(c, MultiValued) and c.pooling == "mean")
            for c in columns
        ]
        self.mlp = nn.Sequential(
            nn.Linear(towers.width(columns), hidden), nn.ReLU(), nn.Linear(hidden, towers.dim)
        )

    def pool(self, tables: Sequence[Tensor], indices: dict[str, Tensor]) -> Tensor:
        """``(B, width)``: :func:`feature_store.models.retrieval_io.pool`, in torch."""
        parts: list[Tensor] = []
        for name, table, multi, mean in self.columns:
            rows = tables[table]
            padded = torch.cat([rows, rows.new_zeros(1, rows.shape[1])], dim=0)
            idx = indices[name]
            picked = padded[idx]
            if multi:
                picked = picked.sum(dim=1)
                if mean:
                    count = (idx < rows.shape[0]).sum(dim=1, keepdim=True)
                    picked = picked / count.clamp(min=1).to(picked.dtype)
            parts.append(picked)
        return torch.cat(parts, dim=1)

    def forward(self, pooled: Tensor) -> Tensor:
        """The normalised vectors of pooled inputs (what the exported ONNX computes)."""
        return functional.normalize(self.mlp(pooled), dim=1)


class TwoTower(nn.Module):
    """A user tower and a video tower over the same tower tables."""

    def __init__(self, towers: Towers, hidden: int) -> None:
        super().__init__()
        self.tables = towers.source_tables
        self.user = Tower(towers.user, self.tables, towers, hidden)
        self.video = Tower(towers.video, self.tables, towers, hidden)


class FrequencyEstimate:
    """Streaming estimate of how often each video occurs (for the logQ correction).

    Two arrays over hashed buckets: ``last[h]``, the step a key of bucket h
    was last seen, and ``gap[h]``, a moving average (rate ``alpha``) of the
    steps between sightings. ``q = 1 / gap``: a video seen every step has
    probability 1 per step. Collisions merge buckets (overestimating a rare
    video's frequency), which is why there are many buckets.
    """

    def __init__(self, buckets: int, alpha: float) -> None:
        self.alpha = alpha
        self.last = np.zeros(buckets, dtype=np.float64)
        self.gap = np.zeros(buckets, dtype=np.float64)
        self.step = 0

    def _buckets(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        return (keys % np.uint64(len(self.last))).astype(np.int64)

    def update(self, keys: npt.NDArray[np.uint64]) -> None:
        """Record one step in which ``keys`` occurred (duplicates count once)."""
        self.step += 1
        h = np.unique(self._buckets(keys))
        seen = self.last[h] > 0
        gap = self.step - self.last[h]
        # A first sighting has no gap yet: start it at the steps so far.
        self.gap[h] = np.where(seen, (1 - self.alpha) * self.gap[h] + self.alpha * gap, gap)
        self.last[h] = self.step

    def log_probability(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
        """``log q`` per key (0 for a bucket not seen yet, as if seen every step)."""
        gap = self.gap[self._buckets(keys)]
        return -np.log(np.maximum(gap, 1.0))

    def to_arrays(self) -> dict[str, npt.NDArray[Any]]:
        return {"last": self.last, "gap": self.gap, "step": np.array([self.step])}

    def load_arrays(self, arrays: Any) -> None:
        if len(arrays["last"]) == len(self.last):  # another bucket count: start afresh
            self.last = np.array(arrays["last"], dtype=np.float64)
            self.gap = np.array(arrays["gap"], dtype=np.float64)
            self.step = int(arrays["step"][0])


class RetrievalTrainer:
    """Buffers positives and trains the towers (see the module docstring)."""

    def __init__(
        self,
        towers: Towers,
        layout: ValueLayout,
        tables: dict[str, SparseTable],
        settings: RetrievalSettings,
    ) -> None:
        self.towers = towers
        self.layout = layout
        self.settings = settings
        self.tables = tables
        self.model = TwoTower(towers, settings.hidden)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.learning_rate)
        self.frequency = FrequencyEstimate(settings.frequency_buckets, settings.frequency_alpha)
        self.video_column = next(
            (c.name for c in towers.video if not isinstance(c, MultiValued)), None
        )
        """The categorical video column whose key identifies a video (logQ, duplicates)."""
        self.pending: list[npt.NDArray[np.uint64]] = []
        """Packed values of the positives not trained yet (checkpointed)."""
        self.steps = 0
        self.failed = 0
        self.last_loss = float("nan")
        self.accuracy = float("nan")
        """Moving average of the in-batch accuracy (the positive ranks first)."""

    @staticmethod
    def positive(sample: Sample) -> bool:
        return sample.label > 0 and sample.weight > 0 and sample.event.type in CHOSEN

    def add(self, samples: Sequence[Sample]) -> int:
        """Buffer the positives of ``samples``; returns how many."""
        chosen = [s.values for s in samples if self.positive(s)]
        self.pending += chosen
        return len(chosen)

    def ready(self) -> bool:
        return len(self.pending) >= self.settings.batch_size

    def step(self) -> bool:
        """Train one batch of buffered positives if there is one; False if not (or failed)."""
        if not self.ready():
            return False
        size = self.settings.batch_size
        rows, self.pending = self.pending[:size], self.pending[size:]
        batch = FeatureValues.stack(self.layout, rows).to_batch()
        try:
            self.train_batch(batch)
        except Exception:  # a backend error, or a bug: the ranker must go on
            self.failed += 1
            log.exception("retrieval step failed (skipped, %d so far)", self.failed)
            return False
        return True

    def pull(self, batch: BatchFeatures, train: bool) -> list[npt.NDArray[np.float32]]:
        """Each tower table's rows for the batch's keys of its ranker table."""
        none = np.zeros(0, dtype=np.uint64)  # a batch of one tower's columns lacks the other's
        requests = [
            (self.tables[tower_table(t)], batch.table_keys.get(t, none)) for t in self.model.tables
        ]
        return pull_many(requests, train=train)

    def train_batch(self, batch: BatchFeatures) -> float:
        """One in-batch softmax step; returns the summed loss."""
        pulled = self.pull(batch, train=True)
        tensors = [torch.from_numpy(np.ascontiguousarray(r)).requires_grad_(True) for r in pulled]
        indices = {name: torch.from_numpy(idx) for name, idx in batch.column_indices.items()}
        self.model.train()
        user = self.model.user(self.model.user.pool(tensors, indices))
        video = self.model.video(self.model.video.pool(tensors, indices))
        logits = user @ video.T / self.settings.temperature
        if self.video_column is not None:
            column = next(c for c in self.towers.video if c.name == self.video_column)
            idx = batch.column_indices[self.video_column]
            keys = batch.table_keys[column.table_name()][idx]
            self.frequency.update(keys)
            logits = logits - torch.from_numpy(self.frequency.log_probability(keys)).float()
            same = torch.from_numpy(idx[:, None] == idx[None, :])
            same.fill_diagonal_(False)
            logits = logits.masked_fill(same, float("-inf"))
        target = torch.arange(len(logits))
        loss = functional.cross_entropy(logits, target, reduction="sum")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        pushes = [
            (self.tables[tower_table(t)], batch.table_keys[t], tensor.grad.numpy())
            for t, tensor in zip(self.model.tables, tensors, strict=True)
            if tensor.grad is not None and len(batch.table_keys[t])
        ]
        for error in push_many(pushes):
            if error is not None:
                raise error
        self.optimizer.step()
        accuracy = float((logits.detach().argmax(dim=1) == target).float().mean())
        self.steps += 1
        self.last_loss = float(loss.detach()) / len(logits)
        rate = max(0.02, 1.0 / self.steps)  # the first steps average, then a moving window
        previous = accuracy if self.steps == 1 else self.accuracy
        self.accuracy = (1 - rate) * previous + rate * accuracy
        return float(loss.detach())

    @torch.no_grad()
    def video_vectors(self, batch: BatchFeatures) -> npt.NDArray[np.float32]:
        """Video vectors of a batch of rows (only the video columns are read)."""
        pulled = self.pull(batch, train=False)
        tensors = [torch.from_numpy(np.ascontiguousarray(r)) for r in pulled]
        indices = {name: torch.from_numpy(idx) for name, idx in batch.column_indices.items()}
        self.model.eval()
        return self.model.video(self.model.video.pool(tensors, indices)).numpy()

    @torch.no_grad()
    def user_vectors(self, batch: BatchFeatures) -> npt.NDArray[np.float32]:
        """User vectors of a batch of rows (only the user columns are read)."""
        pulled = self.pull(batch, train=False)
        tensors = [torch.from_numpy(np.ascontiguousarray(r)) for r in pulled]
        indices = {name: torch.from_numpy(idx) for name, idx in batch.column_indices.items()}
        self.model.eval()
        return self.model.user(self.model.user.pool(tensors, indices)).numpy()

    def status(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "failed_steps": self.failed,
            "pending": len(self.pending),
            "loss": self.last_loss,
            "accuracy": self.accuracy,
        }

    # --- checkpoint ---------------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Dense state, optimizer, counters, the frequency estimate and the buffer."""
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "steps": self.steps,
                "failed": self.failed,
                "accuracy": self.accuracy,
            },
            directory / STATE_FILE,
        )
        pending = (
            np.stack(self.pending) if self.pending
            else np.zeros((0, self.layout.width), np.uint64)
        )
        arrays: dict[str, Any] = {"pending": pending, **self.frequency.to_arrays()}
        np.savez(directory / ARRAYS_FILE, **arrays)

    def restore(self, directory: Path) -> bool:
        """Load what :meth:`save` wrote; False when the checkpoint has no towers."""
        if not (directory / STATE_FILE).is_file():
            return False
        state = torch.load(directory / STATE_FILE, weights_only=True)
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as exc:  # other columns or widths: the towers start afresh
            log.warning("retrieval checkpoint does not fit the towers (%s); starting afresh", exc)
            return False
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.failed = int(state["failed"])
        self.accuracy = float(state["accuracy"])
        with np.load(directory / ARRAYS_FILE) as arrays:
            self.frequency.load_arrays(arrays)
            pending = arrays["pending"]
            if pending.shape[1:] == (self.layout.width,):
                self.pending = list(pending)
        return True
