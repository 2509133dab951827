"""The sequence tower: a SASRec-style causal transformer over each user's views.

Why beside the ranker and the two towers: they read the watch history as a
pooled bag; this reads its order. Each user's chosen videos (the positive
samples of play, finish, like and share, as the towers take them) are kept
in order, as item codes; a refit trains the network on next-view prediction
over windows of ``max_len`` views (every position predicts the view after
it, a softmax over the catalog: Kang and McAuley, 2018), warm-started from
the last refit. Screened on ml-100k point in time before it was built in
(``bench/seq_tower_screen.py``): alone it beat the service's final ranking
(HR@10 0.60 against 0.58), fused +0.034; built in, ml-100k's final ranking went
from 0.5811 to 0.6108 (``docs/benchmarks.md``, *The sequence tower built in*).

Point in time by construction: a refit reads the views trained so far, and
the service encodes the views its own history holds at the request.

The item embedding is tied: the state at a position is scored against the
item vectors, and those vectors are what an export writes for the service
(:mod:`feature_store.models.sequence_io`). Where things run:
:meth:`SequenceTrainer.add` on the trainer's thread; a refit's training in a
worker process (:mod:`trainer.sequence_worker`, the network and its
optimizer live there), sent and collected by the stage's refit thread (or by
the exports, ``sequence.background`` off); the views and codes are guarded
by a lock, and an export reads :attr:`SequenceTrainer.published`, the
weights of the newest refit. The ranking's weight of the tower's logit is
learnt here too (:mod:`trainer.sequence_weight`).
"""

from __future__ import annotations

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
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from feature_store.event_types import of_types
from feature_store.settings import SequenceSettings
from trainer.labels import Sample

if TYPE_CHECKING:
    from trainer.sequence_fit import Fitter

log = logging.getLogger(__name__)

CHOSEN = of_types("chosen")
STATE_FILE = "sequence.pt"
VIEWS_FILE = "sequence_views.npz"
INDEX_FILE = "sequence_index.json"
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


def chosen_views(samples: Sequence[Sample]) -> list[tuple[str, str]]:
    """The ``(user, video)`` of each sample that chose its video (a positive label of a
    chosen event), in order: what the tower learns to predict."""
    return [(s.event.user_id, s.event.video_id) for s in samples
            if s.label > 0 and s.weight > 0 and s.event.type in CHOSEN]


@dataclass(frozen=True)
class Published:
    """A refit's result, for exports: the network (eval mode) and the video of each code
    (``ids[code - 1]``)."""

    tower: SequenceTower
    ids: tuple[str, ...]
    fits: int
    views: int
    """Views the refit trained on."""
    weight: float = 0.0
    """How much the ranking should trust the tower's logit (:mod:`trainer.sequence_weight`)."""

    @classmethod
    def of(cls, state: dict[str, Tensor], settings: SequenceSettings, ids: tuple[str, ...],
           fits: int, views: int, weight: float = 0.0) -> Published:
        tower = SequenceTower(state["item.weight"].shape[0] - 1, settings)
        tower.load_state_dict(state)
        return cls(tower.eval(), ids, fits, views, weight)


@dataclass(frozen=True)
class Started:
    """A refit under way: the views it reads (their count, the video of each code)."""

    count: int
    ids: tuple[str, ...]
    at: float
    """When it began (``time.perf_counter``)."""


class SequenceTrainer:
    """The users' views and their codes, and the refits (see the module doc).

    ``fitter`` runs a refit (:mod:`trainer.sequence_fit`): in this process by default,
    or in a worker process (:class:`trainer.sequence_worker.RemoteFit`)."""

    def __init__(self, settings: SequenceSettings, seed: int = 0,
                 fitter: Fitter | None = None) -> None:
        from trainer.sequence_fit import TowerFit  # it imports this module's network
        from trainer.sequence_weight import FusionWeight

        self.settings = settings
        self.fusion = FusionWeight(settings.max_len)
        self.fitter: Fitter = fitter if fitter is not None else TowerFit(settings, seed)
        self.codes: dict[str, int] = {}
        self.ids: list[str] = []
        self.views: OrderedDict[str, array[int]] = OrderedDict()
        """Per user, the codes of the videos chosen, oldest first (least recently active
        user first)."""
        self.kept = 0
        """Views in :attr:`views`."""
        self.touched: set[str] = set()
        """Users given a view since the factorisation last took them (:meth:`take_touched`);
        only users still kept (an evicted user leaves it too)."""
        self.count = 0
        """Views added since the start (restored from a checkpoint)."""
        self.fitted = 0
        self.fits = 0
        self.refit_seconds = 0.0
        self.published: Published | None = None
        self._lock = threading.Lock()
        self._refitting = threading.Lock()
        """Held by a refit: the refit thread's and an export's never train at once."""

    # --- the trainer's thread ------------------------------------------------------

    def add(self, samples: Sequence[Sample]) -> int:
        """Append the chosen videos of ``samples`` to their users' views; returns how many.

        A video the user chose before moves to the end (the history the service reads
        holds one entry per video, at its newest touch). Every labelled sample with the
        ranker's score of its moment is kept first, with the user's views before it, for
        the fusion weight (:mod:`trainer.sequence_weight`)."""
        self.keep_for_fusion(samples)
        return self.add_views(chosen_views(samples))

    def keep_for_fusion(self, samples: Sequence[Sample]) -> None:
        """Keep each labelled sample, with the user's views before it, for the fusion
        weight (:mod:`trainer.sequence_weight`)."""
        with self._lock:
            for s in samples:
                code = self.codes.get(s.event.video_id, 0)
                mine = self.views.get(s.event.user_id)
                if code and mine and s.weight > 0:
                    self.fusion.keep(mine, code, s.label, s.score)

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
        self.touched.add(user_id)
        extra = len(mine) - self.settings.views_per_user
        if extra > 0:
            del mine[:extra]
            self.kept -= extra

    def take_touched(self) -> tuple[list[str], list[np.ndarray]]:
        """The users given a view since the last call, with a copy of each one's codes
        (oldest first): what the factorisation folds in again (``trainer/factorization.py``)."""
        with self._lock:
            users = list(self.touched)
            self.touched.clear()
            return users, [np.array(self.views[u], dtype=np.int64) for u in users]

    def retouch(self, users: Sequence[str]) -> None:
        """Give ``users`` back to :meth:`take_touched` (their fold-in was not written)."""
        with self._lock:
            self.touched.update(u for u in users if u in self.views)

    def all_views(self) -> tuple[tuple[str, ...], list[str], list[np.ndarray]]:
        """The video of each code (``ids[code - 1]``), every user and a copy of their codes:
        what a factorisation fits on. Clears :attr:`touched` (the fit solves them all)."""
        with self._lock:
            users = list(self.views)
            self.touched.clear()
            return (tuple(self.ids), users,
                    [np.array(self.views[u], dtype=np.int64) for u in users])

    def _evict(self) -> None:
        while self.kept > self.settings.max_views and self.views:
            user, dropped = self.views.popitem(last=False)
            self.kept -= len(dropped)
            self.touched.discard(user)  # bounded by the users kept, taken or not

    def due(self) -> bool:
        """Whether enough views arrived since the last refit: ``min_refit`` for the first,
        then ``min(refit_every, fitted / 10)`` (at least ``min_refit``)."""
        s = self.settings
        every = max(s.min_refit, min(s.refit_every, self.fitted // 10))
        return self.count - self.fitted >= every

    # --- the refit -----------------------------------------------------------------

    def refit_if_due(self, stop: threading.Event | None = None) -> bool:
        """:meth:`refit` when :meth:`due` (checked once any refit under way has ended)."""
        with self._refitting:
            return self.due() and self._refit(stop)

    def refit(self, stop: threading.Event | None = None) -> bool:
        """Train ``epochs`` passes over the kept windows (at most ``max_windows``), then
        publish the weights for exports. False when there was nothing to train on, or
        ``stop`` was set meanwhile (checked between steps: closing never waits for a
        whole refit)."""
        with self._refitting:
            return self._refit(stop)

    def _refit(self, stop: threading.Event | None) -> bool:
        return self.finish(self.begin(), stop)

    def begin(self) -> Started:
        """Start a refit on the views so far (:meth:`finish` publishes it): a worker
        trains while the caller goes on."""
        with self._lock:
            count, ids = self.count, tuple(self.ids)
            views = [v.tolist() for v in self.views.values()]
        self.fitter.start(views, len(ids))
        return Started(count, ids, time.perf_counter())

    def finish(self, started: Started, stop: threading.Event | None = None) -> bool:
        """Wait for the refit :meth:`begin` started and publish it; False when it had
        nothing to train on or ``stop`` was set first."""
        state = self.fitter.result(stop)
        if state is None:
            return False
        with self._lock:
            kept = self.fusion.take()
        serving = self.published
        weight = self.fusion.update(None if serving is None else serving.tower, kept)
        # Published before ``fits`` counts it: a reader that saw the count must find the tower.
        self.published = Published.of(state, self.settings, started.ids, self.fits + 1,
                                      started.count, weight)
        self.fitted, self.fits = started.count, self.fits + 1
        self.refit_seconds = time.perf_counter() - started.at
        return True

    def close(self) -> None:
        self.fitter.close()

    # --- status and checkpoint -----------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"views": self.count, "users": len(self.views), "videos": len(self.ids),
                "fits": self.fits, "fitted_views": self.fitted, "steps": self.fitter.steps,
                "loss": self.fitter.last_loss, "refit_s": round(self.refit_seconds, 3),
                "weight": round(self.fusion.weight, 4), "weight_fit": self.fusion.last}

    def save(self, directory: Path) -> None:
        """The published network (not the one a refit may be training), the codes and the
        views. The optimizer's moments are not kept: a restored tower goes on from its
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
                    "weight": self.fusion.weight},
                   directory / STATE_FILE)
        np.savez(directory / VIEWS_FILE, lengths=lengths, flat=flat)
        (directory / INDEX_FILE).write_text(json.dumps({"users": users, "ids": ids}))

    def restore(self, directory: Path) -> bool:
        """Load what :meth:`save` wrote; False when the checkpoint has no sequence tower or
        one of other dimensions (the network then starts afresh; the views are kept)."""
        if not (directory / STATE_FILE).is_file():
            return False
        state = torch.load(directory / STATE_FILE, weights_only=True)
        index = json.loads((directory / INDEX_FILE).read_text())
        with np.load(directory / VIEWS_FILE) as arrays:
            lengths, flat = arrays["lengths"], arrays["flat"]
        self.ids = [str(i) for i in index["ids"]]
        self.codes = {v: i + 1 for i, v in enumerate(self.ids)}
        self.views.clear()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for k, user in enumerate(index["users"]):
            self.views[str(user)] = array("i", flat[offsets[k]:offsets[k + 1]].tolist())
        self.kept = int(lengths.sum())
        self.count = int(state["count"])
        if state["model"] is None:
            return True
        try:
            self.fusion.weight = float(state.get("weight", 0.0))
            published = Published.of(state["model"], self.settings,
                                     tuple(self.ids[: int(state["ids_known"])]),
                                     int(state["fits"]), int(state["fitted"]),
                                     self.fusion.weight)
        except RuntimeError as exc:
            log.warning("sequence checkpoint does not fit the tower (%s); afresh", exc)
            return False
        self.fitter.load(state["model"])
        self.published = published
        self.fits, self.fitted = published.fits, published.views
        return True
