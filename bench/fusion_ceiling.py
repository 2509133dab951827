"""How far a learned fusion of the service's per-candidate signals could take HR@10.

    python -m bench.screen_loo ../shared/datasets/ml-100k --dump F.npz
    python -m bench.fusion_ceiling F.npz ../shared/datasets/ml-100k/u.data

Reads a ``screen_loo`` dump (per question: every candidate's reranked
probability, co-visitation cosine, two-tower affinity and sequence logit, and
the question's moment) and the ratings it replayed, and scores fusions of
those signals fitted by a listwise softmax (the held-out video against the
question's other candidates). Every figure is cross-fitted: fitted on the
questions of even user ids and read on the odd ones, and vice versa, so none
is tuned on the questions it reports. Extra per-candidate signals, counted
from the ratings strictly before the question's moment: the candidate's views
(``log1p``) and its views in the last 1, 7 and 30 days (trending).

Why: to tell whether the gap to a quality goal is in the mix (a better
fusion would close it) or in the signals (only a stronger model would). On
ml-100k it is in the signals (``docs/benchmarks.md``, *The sequence tower:
latency, fusion ceiling, one tower per group*).
"""

from __future__ import annotations

import argparse
import bisect
import os
import platform
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.scoring.ranking import COSINE_UNIT, fuse, ranking_bonus
from bench.machine import cpu_model
from feature_store.settings import ApiSettings

K = 10
DAY_MS = 86_400_000
SIGNALS = ("log p", "co-visits", "sequence", "affinity", "views", "no sequence",
           "views 1d", "views 7d", "views 30d", "factorization")
SERVICE = len(SIGNALS)
"""The column of the service's own final score."""


def views_before(ratings: Path) -> dict[str, list[int]]:
    """Each video's rating times (ms, sorted), under the ids the evaluation gives them."""
    times: dict[str, list[int]] = defaultdict(list)
    for line in ratings.read_text().splitlines():
        _, item, _, ts = line.split("\t")
        times["ml" + item].append(int(ts) * 1000)
    for column in times.values():
        column.sort()
    return times


def features(dump: Any, times: dict[str, list[int]], shift_ms: int) -> tuple[torch.Tensor, ...]:
    """Per question and candidate, the :data:`SIGNALS` and the service's own final score
    (the default weights, :func:`app.scoring.ranking.fuse`); the mask of real
    candidates; the held-out video's position."""
    rankings, held, moments = dump["rankings"], dump["held"], dump["ts"] - shift_ms
    width = max(len(r["ids"]) for r in rankings)
    api = ApiSettings()
    rows, masks, targets = [], [], []
    for ranking, video, moment in zip(rankings, held, moments, strict=True):
        ids = ranking["ids"]
        n = len(ids)

        def count(v: str, since: float, until: int = moment) -> int:
            return bisect.bisect_left(times[v], until) - bisect.bisect_left(times[v], since)

        sequence, affinity = ranking["sequence"], ranking["affinity"]
        factorized = ranking.get("factorized")  # dumps from before the term: none
        columns = [
            np.log(np.clip(ranking["reranked"], 1e-9, 1.0)),
            np.log1p(ranking["covisits"] / COSINE_UNIT),
            np.zeros(n) if sequence is None else sequence - sequence.max(),
            np.zeros(n) if affinity is None else affinity - affinity.max(),
            np.log1p([count(v, -np.inf) for v in ids]),
            np.full(n, float(sequence is None)),
            *(np.log1p([count(v, moment - days * DAY_MS) for v in ids]) for days in (1, 7, 30)),
            np.zeros(n) if factorized is None else factorized - factorized.max(),
            fuse(ranking["reranked"], ranking_bonus(
                n, affinity, ranking["covisits"], api.retrieval_weight, api.covisit_weight,
                sequence, api.sequence_weight, factorized, api.factorization_weight)),
        ]
        padded = np.zeros((width, len(columns)))
        padded[:n] = np.stack(columns, axis=1)
        mask = np.zeros(width, dtype=bool)
        mask[:n] = True
        rows.append(padded)
        masks.append(mask)
        targets.append(ids.index(video))
    return (torch.tensor(np.array(rows)), torch.tensor(np.array(masks)),
            torch.tensor(targets))


def shift_of(dump: Any, ratings: Path) -> int:
    """The evaluation's time shift: a question's moment minus its rating's own time."""
    user, video = str(dump["users"][0]), str(dump["held"][0])
    for line in ratings.read_text().splitlines():
        u, item, _, ts = line.split("\t")
        if "ml" + u == user and "ml" + item == video:
            return int(dump["ts"][0]) - int(ts) * 1000
    raise SystemExit(f"the first question ({user}, {video}) is not in {ratings}")


def hit_rate(scores: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> float:
    """HR@K: the held-out video among the K best, ties broken by the candidates' order
    (random in the evaluation), as the service's ranking breaks them."""
    scores = scores.masked_fill(~mask, -1e18)
    mine = scores.gather(1, target[:, None])
    before = torch.arange(scores.shape[1])[None, :] < target[:, None]
    ahead = (scores > mine) | ((scores == mine) & before)
    return float((ahead.sum(1) < K).double().mean())


def linear(x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
           columns: Sequence[int]) -> torch.nn.Module:
    """A listwise softmax over a weighted sum of ``columns`` (L2 1e-3), by L-BFGS."""
    net = torch.nn.Linear(len(columns), 1, bias=False).double()
    optimizer = torch.optim.LBFGS(net.parameters(), max_iter=200)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        scores = net(x[:, :, columns]).squeeze(-1).masked_fill(~mask, -1e18)
        loss = torch.nn.functional.cross_entropy(scores, target)
        loss = loss + 1e-3 * sum((p ** 2).sum() for p in net.parameters())
        loss.backward()
        return loss

    optimizer.step(closure)
    return net


def network(x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
            columns: Sequence[int]) -> torch.nn.Module:
    """The same softmax over a small network (16 tanh units) of ``columns``."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(len(columns), 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 1)).double()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(300):
        scores = net(x[:, :, columns]).squeeze(-1).masked_fill(~mask, -1e18)
        loss = torch.nn.functional.cross_entropy(scores, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net


def cross_fitted(fit: Any, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
                 even: torch.Tensor, columns: Sequence[int]) -> float:
    """HR@K of ``fit`` on each half of the questions, fitted on the other half."""
    hits = 0.0
    for pick, read in ((even, ~even), (~even, even)):
        net = fit(x[pick], mask[pick], target[pick], columns)
        with torch.no_grad():
            scores = net(x[read][:, :, columns]).squeeze(-1)
        hits += hit_rate(scores, mask[read], target[read]) * int(read.sum())
    return hits / len(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path, help="bench.screen_loo --dump output (.npz)")
    parser.add_argument("ratings", type=Path, help="the replayed ratings (ml-100k's u.data)")
    args = parser.parse_args()
    dump = np.load(args.dump, allow_pickle=True)
    x, mask, target = features(dump, views_before(args.ratings), shift_of(dump, args.ratings))
    even = torch.tensor([int(str(u)[2:]) % 2 == 0 for u in dump["users"]])
    print(f"{cpu_model(platform.machine())}, {os.cpu_count()} cores")
    print(f"{len(target)} questions; HR@{K}, cross-fitted on even / odd user ids")
    alone = {name: hit_rate(x[:, :, j], mask, target) for j, name in enumerate(SIGNALS[:4])}
    alone["views 1d"] = hit_rate(x[:, :, 6], mask, target)
    print(f"the service: {hit_rate(x[:, :, SERVICE], mask, target):.4f}; alone:",
          ", ".join(f"{name} {hr:.4f}" for name, hr in alone.items()))
    held_views = np.expm1(x[torch.arange(len(target)), target, 4].numpy())
    for low, high in ((0, 20), (20, 50), (50, np.inf)):
        at = torch.from_numpy((held_views >= low) & (held_views < high))
        print(f"held-out video with {low}-{high} views before: {int(at.sum())} questions; "
              f"the service {hit_rate(x[at][:, :, SERVICE], mask[at], target[at]):.4f}, "
              f"the sequence tower alone {hit_rate(x[at][:, :, 2], mask[at], target[at]):.4f}")
    for label, fit, columns in (
        ("linear, the four signals", linear, [0, 1, 2, 3]),
        ("linear, plus views", linear, [0, 1, 2, 3, 4]),
        ("network, the four signals, views, no sequence", network, [0, 1, 2, 3, 4, 5]),
        ("linear, plus views and trending", linear, [0, 1, 2, 3, 4, 6, 7, 8]),
        ("network, all", network, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
    ):
        print(f"{label}: {cross_fitted(fit, x, mask, target, even, columns):.4f}")


if __name__ == "__main__":
    main()
