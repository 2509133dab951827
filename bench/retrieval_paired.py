"""Two settings on the retrieval protocol's same questions, compared question by question.

    python -m bench.retrieval_paired run ../shared/datasets/ml-100k \
        '{"api": {"factorization_weight": 0}}' A.npz
    python -m bench.retrieval_paired run ../shared/datasets/ml-100k '{}' B.npz
    python -m bench.retrieval_paired compare A.npz B.npz

``run`` replays the dataset through the real trainer and service as ``vidrec
eval`` does (``runner.EvalConfig``, the retrieval protocol, the settings given
merged over the evaluation's), without the baselines, and saves each
question's user, video and rank in the service's answer (-1: not retrieved).
``compare`` prints both recall@20 figures, how many questions are hits in one
run only (the discordant pairs) and a two-sided sign test's p over them, and
whether the two runs ranked every question alike (two runs of one tree and
settings should).

Why: 500 questions give recall@20 a standard error of about 0.018, so a
difference between two full runs says little on its own; the discordant
pairs say whether one setting wins on the questions where they differ.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np

K = 20


def run(dataset: Path, settings: str, out: Path) -> None:
    from app.evaluation import runner
    from app.wiring import eval_trainers
    from feature_store.runtime.resources import open_resources

    with tempfile.TemporaryDirectory(prefix="vidrec-paired-") as tmp:
        cfg = runner.EvalConfig(dataset, protocol="retrieval", progress=False,
                                settings=json.loads(settings))
        stream, resolved, queries = runner.prepare(cfg, Path(tmp))
        with open_resources(resolved) as resources:
            resources.catalog.upsert(stream.videos)
            runner._Online(cfg, stream, resources, eval_trainers().replay).run(queries)
    ranks = np.array([-1 if q.rank is None else q.rank for q in queries])
    print(f"{settings}: recall@{K} {np.mean((ranks >= 0) & (ranks < K)):.4f} "
          f"over {len(queries)} questions")
    np.savez(out, ranks=ranks, users=np.array([q.user for q in queries]),
             videos=np.array([q.video for q in queries]))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided binomial p of ``wins`` against ``losses`` at even odds."""
    n, low = wins + losses, min(wins, losses)
    if not n:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def compare(first: Path, second: Path) -> None:
    a, b = np.load(first), np.load(second)
    if not (np.array_equal(a["users"], b["users"]) and np.array_equal(a["videos"], b["videos"])):
        raise SystemExit("the two runs asked different questions")
    hit_a = (a["ranks"] >= 0) & (a["ranks"] < K)
    hit_b = (b["ranks"] >= 0) & (b["ranks"] < K)
    only_a, only_b = int((hit_a & ~hit_b).sum()), int((hit_b & ~hit_a).sum())
    print(json.dumps({
        "questions": len(hit_a),
        f"recall@{K}": [round(float(hit_a.mean()), 4), round(float(hit_b.mean()), 4)],
        "hits_only_in_first": only_a, "hits_only_in_second": only_b,
        "sign_test_p": round(sign_test(only_a, only_b), 3),
        "retrieved_in_both_alike": bool(np.array_equal(a["ranks"] < 0, b["ranks"] < 0)),
        "every_rank_alike": bool(np.array_equal(a["ranks"], b["ranks"])),
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("dataset", type=Path)
    one.add_argument("settings", help="settings sections (JSON) merged over eval's")
    one.add_argument("out", type=Path)
    two = sub.add_parser("compare")
    two.add_argument("first", type=Path)
    two.add_argument("second", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.dataset, args.settings, args.out)
    else:
        compare(args.first, args.second)


if __name__ == "__main__":
    main()
