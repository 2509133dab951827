"""Would a matrix factorisation's score, fused into the final ranking, lift HR@10?

    python -m bench.screen_loo ../shared/datasets/ml-100k --dump F.npz
    python -m bench.als_signal_screen F.npz ../shared/datasets/ml-100k/u.data
    python -m bench.screen_loo ../shared/datasets/ml-100k --validate --dump V.npz
    python -m bench.als_signal_screen V.npz ../shared/datasets/ml-100k/u.data --validate [--grid]

Reads a ``screen_loo`` dump and the ratings it replayed, scores every question's
candidates with the evaluation's own ALS baseline
(:class:`app.evaluation.factorization.MatrixFactorization`, its settings, point in
time: item factors fitted on the pairs before the latest refit point, the user
folded in from their pairs strictly before the question's moment, the held-out
pairs of every question never fitted) and fits, cross-fitted on even / odd user
ids as :mod:`bench.fusion_ceiling` does, the service's final score plus a weight
times the ALS score (standardised over the request's candidates; a candidate
without a factor gets the request's lowest).

Why: the two-tower affinity, the service's own factorisation-like signal, ranks
far below ALS on its own (0.39 against 0.54 on ml-100k), and the fusion ceiling
says the gap to the quality goal is in the signals. If ALS's score adds what the
affinity does not, the lever is a better-fitted user and video factorisation.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch

from app.evaluation.factorization import AlsParams, MatrixFactorization
from bench.fusion_ceiling import (
    SERVICE,
    cross_fitted,
    features,
    hit_rate,
    linear,
    shift_of,
    views_before,
)
from bench.machine import cpu_model
from bench.screen_loo import validation_copy


class NewestPairs(MatrixFactorization):
    """The evaluation's ALS with each user folded in from their newest ``history`` pairs
    before the moment (what a service that keeps a capped history could solve from)."""

    def __init__(self, *args: object, history: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.history = history

    def _user_items(self, user: str, before: int) -> np.ndarray | None:
        items = super()._user_items(user, before)
        return None if items is None else items[-self.history:]


def als_column(dump: np.lib.npyio.NpzFile, ratings: Path, shift_ms: int, width: int,
               params: AlsParams, history: int | None) -> torch.Tensor:
    """Per question and candidate, the ALS score standardised over the candidates
    (``history``: the user folded in from their newest pairs only)."""
    rows = [line.split("\t") for line in ratings.read_text().splitlines()]
    held = {(str(u), str(v)) for u, v in zip(dump["users"], dump["held"], strict=True)}
    order = sorted(range(len(rows)), key=lambda i: int(rows[i][3]))
    users = ["ml" + rows[i][0] for i in order]
    videos = ["ml" + rows[i][1] for i in order]
    times = np.array([int(rows[i][3]) * 1000 for i in order])
    positive = np.array([(u, v) not in held for u, v in zip(users, videos, strict=True)])
    mf = (MatrixFactorization(users, videos, positive, params) if history is None
          else NewestPairs(users, videos, positive, params, history=history))
    moments = dump["ts"] - shift_ms
    asked = np.argsort(moments, kind="stable")
    out = np.zeros((len(moments), width))
    for q in asked.tolist():
        ids = list(dump["rankings"][q]["ids"])
        before = int(np.searchsorted(times, moments[q]))
        s = mf.scores(str(dump["users"][q]), ids, before)
        finite = np.isfinite(s)
        s = np.where(finite, s, s[finite].min() if finite.any() else 0.0)
        out[q, :len(ids)] = (s - s.mean()) / (s.std() + 1e-9)
    print(f"ALS: {mf.fits} fits")
    return torch.from_numpy(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("ratings", type=Path)
    parser.add_argument("--refit-every", type=int, default=AlsParams().refit_every)
    parser.add_argument("--history", type=int, default=None)
    parser.add_argument("--validate", action="store_true",
                        help="a screen_loo --validate dump: drop each user's last rating, "
                             "as its replay did (ratings: the dataset's u.data)")
    parser.add_argument("--grid", action="store_true",
                        help="also the other weights' grid beside the ALS term's (in sample)")
    args = parser.parse_args()
    dump = np.load(args.dump, allow_pickle=True)
    with tempfile.TemporaryDirectory(prefix="vidrec-als-") as tmp:
        if args.validate:
            args.ratings = validation_copy(args.ratings.parent, Path(tmp) / "v") / "u.data"
        report(args, dump)


def report(args: argparse.Namespace, dump: np.lib.npyio.NpzFile) -> None:
    """Scores the ALS column and prints the fusions (see the module doc)."""
    shift = shift_of(dump, args.ratings)
    x, mask, target = features(dump, views_before(args.ratings), shift)
    als = als_column(dump, args.ratings, shift, x.shape[1],
                     AlsParams(refit_every=args.refit_every), args.history)
    x = torch.cat([x, als[:, :, None]], dim=2)
    column = x.shape[2] - 1
    even = torch.tensor([int(str(u)[2:]) % 2 == 0 for u in dump["users"]])
    print(f"{cpu_model(platform.machine())}, {os.cpu_count()} cores; {len(target)} questions")
    print(f"the service {hit_rate(x[:, :, SERVICE], mask, target):.4f}; "
          f"ALS alone {hit_rate(x[:, :, column], mask, target):.4f}")
    for label, columns in (("service + ALS", [SERVICE, column]),
                           ("linear four signals", [0, 1, 2, 3]),
                           ("linear four signals + ALS", [0, 1, 2, 3, column])):
        print(f"{label}, cross-fitted: "
              f"{cross_fitted(linear, x, mask, target, even, columns):.4f}")
    net = linear(x, mask, target, [0, 1, 2, 3, column])
    w = net.state_dict()["weight"][0].tolist()
    print("linear four signals + ALS, fitted on every question, in the service's units "
          f"(per unit of log p): covisit_weight {w[1] / w[0]:.3f}, sequence_weight "
          f"{w[2] / w[0]:.3f}, retrieval_weight {w[3] / w[0]:.3f}, factorization_weight "
          f"{w[4] / w[0]:.3f}")
    for w in (0.0, 0.1, 0.2, 0.3, 0.5, 0.8):
        fused = x[:, :, SERVICE] + w * x[:, :, column]
        print(f"service + {w} * ALS (in sample): {hit_rate(fused, mask, target):.4f}")
    if args.grid:
        weight_grid(x, mask, target, column)


def weight_grid(x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor, column: int) -> None:
    """In sample, HR@10 of log p plus the other terms at a grid of the service's weights
    (two-tower, co-visitation, sequence) and the ALS term's (``--grid``): whether the other
    weights want to move with the new term."""
    for retrieval in (0.0, 0.25, 0.5):
        for covisit in (1.5, 2.0, 2.5):
            for sequence in (0.6, 1.0):
                row = []
                for w in (0.3, 0.5, 0.8, 1.0, 1.5):
                    fused = (x[:, :, 0] + covisit * x[:, :, 1] + sequence * x[:, :, 2]
                             + retrieval * x[:, :, 3] + w * x[:, :, column])
                    row.append(f"{w}: {hit_rate(fused, mask, target):.4f}")
                print(f"retrieval {retrieval}, covisit {covisit}, sequence {sequence}; "
                      "ALS " + ", ".join(row))


if __name__ == "__main__":
    main()
