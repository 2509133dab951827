"""A momentum term for the ranking, screened on validation questions: tried, not kept.

    python -m bench.screen_loo ../shared/datasets/ml-100k --validate --dump V.npz
    python -m bench.screen_loo ../shared/datasets/ml-100k --dump T.npz
    python -m bench.momentum_screen V.npz T.npz ../shared/datasets/ml-100k

Reads two ``screen_loo`` dumps: validation (each user's second-to-last view, the
last never read) and test (the last view). Per question it recomputes the
service's ranking without the momentum term (whatever the dump's service had)
and adds ``w * log((recent + 1) / (views + 1))`` per candidate, where ``views``
are the candidate's ratings strictly before the question's moment and
``recent`` the same ratings each halved per half-life ``H`` since it happened
(the service counts trending-weighted events; on a ratings log every view is
one event, so the two differ by a constant weight). It prints HR@10 on both
sets for a grid of ``H`` and ``w`` and the pair chosen on validation, read on
test: the test questions choose nothing. Then the same term with a prior share
for videos of few views, ``log((recent + m) / (views + 1))``, ``m`` the
question's candidates' recent views over their views: a never-viewed video
scores the candidates' mean share instead of the best possible 0.

Built into the service (7 days, 0.75) it lifted ml-100k's leave-one-out HR@10
from 0.6352 to 0.6469 but cut ``vidrec eval``'s retrieval protocol recall@20
from 0.2700 to 0.1860: a video never engaged has the best possible term (0),
so the never-watched fresh videos of a retrieved pool jump ahead; with a
prior share for them the leave-one-out gain was gone too (``docs/benchmarks.md``,
*Momentum*).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.scoring.ranking import fuse, ranking_bonus
from bench.fusion_ceiling import DAY_MS, hit_rate, shift_of, views_before
from bench.machine import cpu_model
from bench.screen_loo import validation_copy
from feature_store.settings import ApiSettings

HALF_LIVES_DAYS = (0.5, 1, 2, 3, 5, 7, 14)
WEIGHTS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)


def questions(dump_path: Path, ratings: Path) -> dict[str, Any]:
    """Per question and candidate (padded): the service's score without momentum, the
    views before the moment, and their decayed counts per half-life; the mask and the
    held-out video's position."""
    dump = np.load(dump_path, allow_pickle=True)
    times = {v: np.asarray(t, np.float64) for v, t in views_before(ratings).items()}
    rankings, moments = dump["rankings"], dump["ts"] - shift_of(dump, ratings)
    width = max(len(r["ids"]) for r in rankings)
    api = ApiSettings()
    base = np.full((len(rankings), width), -1e18)
    views = np.zeros((len(rankings), width))
    recent = {h: np.zeros((len(rankings), width)) for h in HALF_LIVES_DAYS}
    mask = np.zeros((len(rankings), width), dtype=bool)
    targets = []
    for i, (r, moment) in enumerate(zip(rankings, moments, strict=True)):
        ids, n = r["ids"], len(r["ids"])
        base[i, :n] = fuse(r["reranked"], ranking_bonus(
            n, r["affinity"], r["covisits"], api.retrieval_weight, api.covisit_weight,
            r.get("sequence"), api.sequence_weight))
        mask[i, :n] = True
        targets.append(ids.index(str(dump["held"][i])))
        for j, video in enumerate(ids):
            before = times.get(video, np.zeros(0))
            before = before[before < moment]
            views[i, j] = len(before)
            for h in HALF_LIVES_DAYS:
                recent[h][i, j] = np.sum(2.0 ** (-(moment - before) / (h * DAY_MS)))
    return {"base": base, "views": views, "recent": recent,
            "mask": torch.from_numpy(mask), "target": torch.tensor(targets)}


def hr(q: dict[str, Any], half_life: float, weight: float, prior: bool = False) -> float:
    """HR@10 of the service without momentum plus ``weight`` times the term (``prior``:
    the prior-share variant, see the module doc)."""
    recent, views = q["recent"][half_life], q["views"]
    if prior:
        share = recent.sum(1, keepdims=True) / np.maximum(views.sum(1, keepdims=True), 1e-9)
        term = np.log(recent + np.clip(share, 1e-6, 1.0)) - np.log1p(views)
    else:
        term = np.log1p(recent) - np.log1p(views)
    scores = torch.from_numpy(q["base"] + weight * term)
    return hit_rate(scores, q["mask"], q["target"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("validation", type=Path, help="screen_loo --validate --dump output")
    parser.add_argument("test", type=Path, help="screen_loo --dump output")
    parser.add_argument("dataset", type=Path, help="the ml-100k directory both replayed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidrec-momentum-") as tmp:
        # The validation replay never saw the last views: neither do its counts.
        trimmed = validation_copy(args.dataset, Path(tmp) / "validation")
        sets = {"validation": questions(args.validation, trimmed / "u.data"),
                "test": questions(args.test, args.dataset / "u.data")}
    print(f"{cpu_model(platform.machine())}, {os.cpu_count()} cores")
    for name, q in sets.items():
        base = hit_rate(torch.from_numpy(q["base"]), q["mask"], q["target"])
        print(f"{name}: {len(q['target'])} questions; the service without momentum {base:.4f}")
    grid = {(h, w): (hr(sets["validation"], h, w), hr(sets["test"], h, w))
            for h in HALF_LIVES_DAYS for w in WEIGHTS}
    print("HR@10 validation / test, per half-life (days) and weight")
    for h in HALF_LIVES_DAYS:
        print(f"{h:>4} d: " + "  ".join(f"{w}: {grid[h, w][0]:.4f} / {grid[h, w][1]:.4f}"
                                        for w in WEIGHTS))
    chosen = max(grid, key=lambda k: grid[k][0])
    print(f"chosen on validation: {chosen[0]} d, weight {chosen[1]}: "
          f"validation {grid[chosen][0]:.4f}, test {grid[chosen][1]:.4f}")
    with_prior = [hr(sets[name], *chosen, prior=True) for name in ("validation", "test")]
    print(f"with a prior share, same setting: validation {with_prior[0]:.4f}, "
          f"test {with_prior[1]:.4f}")


if __name__ == "__main__":
    main()
