"""The sequence tower: a SASRec-style causal transformer over each user's views.

Why beside the ranker and the two towers: they read the watch history as a
pooled bag; this reads its order. Each user's chosen videos (the positive
samples of play, finish, like and share, as the towers take them) are kept
in order, as item codes; a refit trains the network on next-view prediction
over windows of ``max_len`` views (every position predicts the view after
it, a softmax over the catalog: Kang and McAuley, 2018), warm-started from
the last refit. Screened on ml-100k point in time before it was built in
(``bench/seq_tower_screen.py``): alone it beat the service's final ranking
(HR@10 0.60 against 0.58), fused +0.034.

Point in time by construction: a refit reads the views trained so far, and
the service encodes the views its own history holds at the request.

The item embedding is tied: the state at a position is scored against the
item vectors, and those vectors are what an export writes for the service
(:mod:`feature_store.models.sequence_io`). Threads: :meth:`SequenceTrainer.add`
runs on the trainer's thread, :meth:`SequenceTrainer.refit` on the refit
thread (or the export's, ``sequence.background`` off); the views and codes
are guarded by a lock, the network is only ever touched by the refit, and an
export reads :attr:`SequenceTrainer.published`, a copy made after each refit.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

from feature_store.event_types import of_types
from feature_store.models.sequence_io import left_padded
from feature_store.settings import SequenceSettings
from trainer.labels import Sample

log = logging.getLogger(__name__)

CHOSEN = of_types("chosen")
STATE_FILE = "sequence.pt"
VIEWS_FILE = "sequence_views.npz"
Window = tuple[Sequence[int], Sequence[int]]
"""A window's input codes and, position by position, the code that followed each."""


class Block(nn.Module):
    """Pre-norm causal self-attention and a position-wise feed-forward, residual both.

    The attention is written out (not ``nn.MultiheadAttention``) so that the ONNX
    export is plain matrix products whatever the exporter's fast paths do."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(dim, dim), nn.Dropout(dropout))

    def forward(self, x: Tensor, blocked: Tensor) -> Tensor:
        """``x`` ``(B, L, dim)``; ``blocked`` ``(B, 1, L, L)``, True where a query must not
        look (a later position, a padding slot)."""
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        shape = (batch, length, self.heads, dim // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim // self.heads)
        weights = self.attn_drop(torch.softmax(scores.masked_fill(blocked, -1e9), dim=-1))
        attended = (weights @ v).transpose(1, 2).reshape(batch, length, dim)
        x = x + self.out(attended)
        return x + self.ff(self.norm2(x))


class SequenceTower(nn.Module):
    """Left-padded item codes ``(B, L)`` (0: padding) -> one state per position."""

    def __init__(self, items: int, s: SequenceSettings) -> None:
        super().__init__()
        self.dim = s.dim
        self.item = nn.Embedding(items + 1, s.dim, padding_idx=0)
        self.pos = nn.Embedding(s.max_len, s.dim)
        self.drop = nn.Dropout(s.dropout)
        self.blocks = nn.ModuleList(Block(s.dim, s.heads, s.dropout) for _ in range(s.blocks))
        self.norm = nn.LayerNorm(s.dim)
        nn.init.normal_(self.item.weight, std=s.dim ** -0.5)
        with torch.no_grad():
            self.item.weight[0].zero_()

    def forward(self, codes: Tensor) -> Tensor:
        length = codes.shape[1]
        real = (codes != 0).unsqueeze(-1).to(self.item.weight.dtype)
        x = self.item(codes) * math.sqrt(self.dim) + self.pos.weight[-length:]
        x = self.drop(x) * real
        # A query attends to itself and the real views before it (never a later one, never
        # a padding slot); a padding slot attends only to itself, so no row is empty.
        steps = torch.arange(length, device=codes.device)
        ahead = steps.unsqueeze(0) > steps.unsqueeze(1)
        pad = (codes == 0).unsqueeze(1)
        blocked = (ahead.unsqueeze(0) | pad) & (steps.unsqueeze(0) != steps.unsqueeze(1))
        blocked = blocked.unsqueeze(1)
        for block in self.blocks:
            x = block(x, blocked) * real
        return self.norm(x)

    def last_state(self, codes: Tensor) -> Tensor:
        """``(B, dim)``: the state at the newest position (what the service scores with)."""
        return self(codes)[:, -1]


class Encoder(nn.Module):
    """The exported graph: codes -> the newest position's state."""

    def __init__(self, tower: SequenceTower) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, codes: Tensor) -> Tensor:
        return self.tower.last_state(codes)


def windows(views: Sequence[int], max_len: int) -> list[Window]:
    """One user's views as (inputs, next views) windows of at most ``max_len``, newest
    first; every view but the first is a target once."""
    out: list[Window] = []
    end = len(views)
    while end > 1:
        start = max(0, end - max_len - 1)
        seg = list(views[start:end])
        out.append((seg[:-1], seg[1:]))
        end = start + 1 if start > 0 else 0
    return out


@dataclass(frozen=True)
class Published:
    """A refit's result, for exports: a copy of the network (eval mode) and the video
    of each code (``ids[code - 1]``)."""

    tower: SequenceTower
    ids: tuple[str, ...]
    fits: int
    views: int
    """Views the refit trained on."""


class SequenceTrainer:
    """The tower, its optimizer, the users' views and their codes; see the module doc."""

    def __init__(self, settings: SequenceSettings, seed: int = 0) -> None:
        self.settings = settings
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.capacity = 1024
        """Videos the network's embedding has rows for (grown by doubling)."""
        self.model = SequenceTower(self.capacity, settings)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.learning_rate)
        self.codes: dict[str, int] = {}
        self.ids: list[str] = []
        self.views: OrderedDict[str, array[int]] = OrderedDict()
        """Per user, the codes of the videos chosen, oldest first (least recently active
        user first)."""
        self.kept = 0
        """Views in :attr:`views`."""
        self.count = 0
        """Views added since the start (restored from a checkpoint)."""
        self.fitted = 0
        self.fits = 0
        self.steps = 0
        self.last_loss = math.nan
        self.refit_seconds = 0.0
        self.published: Published | None = None
        self._lock = threading.Lock()
        self._refitting = threading.Lock()
        """Held by a refit: the refit thread's and an export's never train at once."""

    # --- the trainer's thread ------------------------------------------------------

    def add(self, samples: Sequence[Sample]) -> int:
        """Append the chosen videos of ``samples`` to their users' views; returns how many.

        A video the user chose before moves to the end (the history the service reads
        holds one entry per video, at its newest touch)."""
        return self.add_views([
            (s.event.user_id, s.event.video_id) for s in samples
            if s.label > 0 and s.weight > 0 and s.event.type in CHOSEN
        ])

    def add_views(self, views: Sequence[tuple[str, str]]) -> int:
        """Append ``(user, video)`` views in order; returns how many were coded (a video
        past ``max_videos`` is not)."""
        added = 0
        with self._lock:
            for user_id, video_id in views:
                code = self._code(video_id)
                if code:
                    self._append(user_id, code)
                    added += 1
            self.count += added
            self._evict()
        return added

    def _code(self, video_id: str) -> int:
        code = self.codes.get(video_id)
        if code is None:
            if len(self.ids) >= self.settings.max_videos:
                return 0
            self.ids.append(video_id)
            code = self.codes[video_id] = len(self.ids)
        return code

    def _append(self, user_id: str, code: int) -> None:
        mine = self.views.get(user_id)
        if mine is None:
            mine = self.views[user_id] = array("i")
        else:
            self.views.move_to_end(user_id)
            if code in mine:
                mine.remove(code)
                self.kept -= 1
        mine.append(code)
        self.kept += 1
        extra = len(mine) - self.settings.views_per_user
        if extra > 0:
            del mine[:extra]
            self.kept -= extra

    def _evict(self) -> None:
        while self.kept > self.settings.max_views and self.views:
            _, dropped = self.views.popitem(last=False)
            self.kept -= len(dropped)

    def due(self) -> bool:
        """Whether enough views arrived since the last refit (and there are any)."""
        s = self.settings
        every = max(s.min_refit, min(s.refit_every, self.fitted // 10))
        new = self.count - self.fitted
        return new > 0 and (self.fits == 0 or new >= every)

    # --- the refit -----------------------------------------------------------------

    def refit_if_due(self, stop: threading.Event | None = None) -> bool:
        """:meth:`refit` when :meth:`due` (checked once any refit under way has ended)."""
        with self._refitting:
            return self.due() and self._refit(stop)

    def refit(self, stop: threading.Event | None = None) -> bool:
        """:meth:`_refit`, after any refit under way."""
        with self._refitting:
            return self._refit(stop)

    def _refit(self, stop: threading.Event | None = None) -> bool:
        """Train ``epochs`` passes over the kept windows (at most ``max_windows``); then
        publish a copy for exports. False when there was nothing to train on, or ``stop``
        was set meanwhile (checked between steps: closing never waits for a whole refit)."""
        started = time.perf_counter()
        with self._lock:
            count, items = self.count, len(self.ids)
            data = [w for v in self.views.values() for w in windows(v, self.settings.max_len)]
            ids = tuple(self.ids)
        if not data:
            return False
        if len(data) > self.settings.max_windows:
            picked = self.rng.choice(len(data), self.settings.max_windows, replace=False)
            data = [data[i] for i in picked]
        self._grow(items)
        self.model.train()
        for _ in range(self.settings.epochs):
            order = self.rng.permutation(len(data)).tolist()
            for start in range(0, len(data), self.settings.batch_size):
                if stop is not None and stop.is_set():
                    return False
                self._step([data[i] for i in order[start:start + self.settings.batch_size]],
                           items)
        self.fitted, self.fits = count, self.fits + 1
        self.refit_seconds = time.perf_counter() - started
        self.published = Published(copy.deepcopy(self.model).eval(), ids, self.fits, count)
        return True

    def _step(self, chunk: list[Window], items: int) -> None:
        length = max(len(x) for x, _ in chunk)
        codes = torch.from_numpy(left_padded([x for x, _ in chunk], length))
        target = torch.from_numpy(left_padded([y for _, y in chunk], length))
        states = self.model(codes)[target > 0]
        wanted = target[target > 0]
        table = self.model.item.weight[1:items + 1]
        if items <= self.settings.sampled_above:
            loss = functional.cross_entropy(states @ table.T, wanted - 1)
        else:  # the targets against uniformly drawn videos (a draw of a target is masked)
            drawn = torch.from_numpy(self.rng.integers(1, items + 1, self.settings.negatives))
            positive = (states * self.model.item.weight[wanted]).sum(-1, keepdim=True)
            negative = states @ self.model.item.weight[drawn].T
            negative = negative.masked_fill(drawn.unsqueeze(0) == wanted.unsqueeze(1), -1e9)
            logits = torch.cat([positive, negative], dim=1)
            loss = functional.cross_entropy(logits, torch.zeros(len(wanted), dtype=torch.long))
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

    # --- status and checkpoint -----------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"views": self.count, "users": len(self.views), "videos": len(self.ids),
                "fits": self.fits, "fitted_views": self.fitted, "steps": self.steps,
                "loss": self.last_loss, "refit_s": round(self.refit_seconds, 3)}

    def save(self, directory: Path) -> None:
        """The published network (not the one a refit may be training), the codes and the
        views. The optimizer's moments are not kept: a restored tower warm-starts its
        weights with fresh moments."""
        with self._lock:
            users = list(self.views)
            lengths = np.array([len(v) for v in self.views.values()], dtype=np.int64)
            flat = np.concatenate([np.frombuffer(v, dtype=np.int32) for v in self.views.values()]
                                  ) if users else np.zeros(0, np.int32)
            ids, count = list(self.ids), self.count
        published = self.published
        torch.save({"model": None if published is None else published.tower.state_dict(),
                    "ids_known": len(published.ids) if published else 0,
                    "fits": self.fits, "fitted": self.fitted, "count": count,
                    "steps": self.steps}, directory / STATE_FILE)
        np.savez(directory / VIEWS_FILE, lengths=lengths, flat=flat)
        (directory / "sequence_index.json").write_text(json.dumps({"users": users, "ids": ids}))

    def restore(self, directory: Path) -> bool:
        """Load what :meth:`save` wrote; False when the checkpoint has no sequence tower or
        one of other dimensions (the tower then starts afresh)."""
        if not (directory / STATE_FILE).is_file():
            return False
        state = torch.load(directory / STATE_FILE, weights_only=True)
        index = json.loads((directory / "sequence_index.json").read_text())
        with np.load(directory / VIEWS_FILE) as arrays:
            lengths, flat = arrays["lengths"], arrays["flat"]
        self.ids = [str(i) for i in index["ids"]]
        self.codes = {v: i + 1 for i, v in enumerate(self.ids)}
        self.views.clear()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for k, user in enumerate(index["users"]):
            self.views[str(user)] = array("i", flat[offsets[k]:offsets[k + 1]].tolist())
        self.kept = int(lengths.sum())
        self.count, self.steps = int(state["count"]), int(state["steps"])
        if state["model"] is not None:
            rows = state["model"]["item.weight"].shape[0] - 1
            model = SequenceTower(rows, self.settings)
            try:
                model.load_state_dict(state["model"])
            except RuntimeError as exc:
                log.warning("sequence checkpoint does not fit the tower (%s); afresh", exc)
                return False
            self.model, self.capacity = model, rows
            self.optimizer = torch.optim.Adam(model.parameters(), lr=self.settings.learning_rate)
            self.fits, self.fitted = int(state["fits"]), int(state["fitted"])
            self.published = Published(copy.deepcopy(model).eval(),
                                       tuple(self.ids[: int(state["ids_known"])]),
                                       self.fits, self.fitted)
        return True
