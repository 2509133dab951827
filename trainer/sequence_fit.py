"""A refit of the sequence tower: its network, optimizer and training passes.

Kept apart from the users' views (:class:`trainer.sequence.SequenceTrainer`)
because it runs in one of two places: in the trainer's process (the
evaluation's replay, where refits are synchronous) or in a child process of
its own (:mod:`trainer.sequence_worker`, online), where its Python does not
take the GIL from the trainer's thread and the API's. Either way a refit is
``fit(views, items, stop)`` -> the network's weights, warm-started from the
previous refit: the same network and the same optimizer's moments go on.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

from feature_store.models.sequence_io import left_padded
from feature_store.settings import SequenceSettings
from trainer.sequence import SequenceTower, Window, windows

State = dict[str, Tensor]
"""A network's weights (``state_dict``), its item embedding's rows the capacity + 1."""
START_CAPACITY = 1024
"""Videos the first network has rows for (grown by doubling)."""


class Fitter(Protocol):
    """What :class:`~trainer.sequence.SequenceTrainer` asks of a refit's runner."""

    steps: int
    last_loss: float

    def fit(self, views: Sequence[Sequence[int]], items: int,
            stop: threading.Event | None = None) -> State | None:
        """Train on the users' ``views`` (codes, oldest first) of ``items`` coded videos;
        the new weights, or None (nothing to train on, or ``stop`` set meanwhile)."""
        ...

    def start(self, views: Sequence[Sequence[int]], items: int) -> None:
        """Begin :meth:`fit` (a worker trains meanwhile; in this process, at :meth:`result`)."""
        ...

    def result(self, stop: threading.Event | None = None) -> State | None:
        """What the refit :meth:`start` began gives (as :meth:`fit`)."""
        ...

    def load(self, state: State) -> None:
        """Go on from ``state`` (a checkpoint's weights; fresh optimizer moments)."""
        ...

    def close(self) -> None: ...


class TowerFit:
    """The network and its optimizer, trained in this process (see the module doc)."""

    def __init__(self, settings: SequenceSettings, seed: int = 0) -> None:
        self.settings = settings
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.capacity = START_CAPACITY
        self.model = SequenceTower(self.capacity, settings)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.learning_rate)
        self.steps = 0
        self.last_loss = math.nan
        self._started: tuple[Sequence[Sequence[int]], int] | None = None

    def start(self, views: Sequence[Sequence[int]], items: int) -> None:
        self._started = (views, items)

    def result(self, stop: threading.Event | None = None) -> State | None:
        started, self._started = self._started, None
        return None if started is None else self.fit(*started, stop)

    def fit(self, views: Sequence[Sequence[int]], items: int,
            stop: threading.Event | None = None) -> State | None:
        s = self.settings
        data = [w for v in views for w in windows(v, s.max_len)]
        if not data:
            return None
        if len(data) > s.max_windows:
            data = [data[i] for i in self.rng.choice(len(data), s.max_windows, replace=False)]
        self._grow(items)
        self.model.train()
        for _ in range(s.epochs):
            order = self.rng.permutation(len(data)).tolist()
            for start in range(0, len(data), s.batch_size):
                if stop is not None and stop.is_set():
                    return None
                self._step([data[i] for i in order[start:start + s.batch_size]], items)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load(self, state: State) -> None:
        rows = state["item.weight"].shape[0] - 1
        model = SequenceTower(rows, self.settings)
        model.load_state_dict(state)
        self.model, self.capacity = model, rows
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.settings.learning_rate)

    def close(self) -> None:
        pass

    def _step(self, chunk: list[Window], items: int) -> None:
        length = max(len(x) for x, _ in chunk)
        codes = torch.from_numpy(left_padded([x for x, _ in chunk], length))
        target = torch.from_numpy(left_padded([y for _, y in chunk], length))
        states = self.model(codes)[target > 0]
        wanted = target[target > 0]
        weight = self.model.item.weight
        if items <= self.settings.sampled_above:
            loss = functional.cross_entropy(states @ weight[1:items + 1].T, wanted - 1)
        else:  # the targets against uniformly drawn videos (a draw of a target is masked)
            drawn = torch.from_numpy(self.rng.integers(1, items + 1, self.settings.negatives))
            positive = (states * weight[wanted]).sum(-1, keepdim=True)
            negative = (states @ weight[drawn].T).masked_fill(
                drawn.unsqueeze(0) == wanted.unsqueeze(1), -1e9)
            loss = functional.cross_entropy(torch.cat([positive, negative], dim=1),
                                            torch.zeros(len(wanted), dtype=torch.long))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        self.last_loss = float(loss.detach())

    def _grow(self, items: int) -> None:
        """Room for ``items`` videos in the embedding (and the optimizer's moments)."""
        if items <= self.capacity:
            return
        capacity = max(items, 2 * self.capacity)
        old = self.model.item.weight
        grown = nn.Embedding(capacity + 1, self.settings.dim, padding_idx=0)
        with torch.no_grad():
            nn.init.normal_(grown.weight, std=self.settings.dim ** -0.5)
            grown.weight[0].zero_()
            grown.weight[: old.shape[0]] = old
        state = self.optimizer.state.pop(old, None)
        self.model.item = grown
        params = self.optimizer.param_groups[0]["params"]
        params[[p is old for p in params].index(True)] = grown.weight
        if state:
            for key in ("exp_avg", "exp_avg_sq"):
                moment = torch.zeros_like(grown.weight)
                moment[: old.shape[0]] = state[key]
                state[key] = moment
            self.optimizer.state[grown.weight] = state
        self.capacity = capacity
