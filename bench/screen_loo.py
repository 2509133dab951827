"""Screening for ranking-quality work: the leave-one-out replay of ``vidrec eval`` alone.

``vidrec eval DATASET --protocol loo --negatives 1`` spends its time in three
places: the replay (trainer, signal feed and service at each question), the
baselines (164 ALS fits on ml-100k) and the offline Wide&Deep. A change to the
model, its features or the final ranking moves only the first, so this script
runs only the replay, through the same code (:func:`app.evaluation.runner.prepare`
and its ``_Online`` pass), and prints the figures it gives: the service's and
the ranker's HR@10 / NDCG@10 are identical to the full run's (ml-100k: 0.5811
/ 0.5684 both ways), at 226-241 s of CPU instead of the full run's replay,
baselines and offline model. It is for screening; figures for the docs come from
``vidrec eval``.

It also records, per question, every candidate's probability, reranked
probability, two-tower affinity and co-visitation count (``--dump FILE.npz``),
and prints the final ranking's HR@10 under a grid of the two bonus weights
(``api.retrieval_weight``, ``api.covisit_weight``) recomputed from them, and
under a sweep of ``api.sequence_weight`` with its cross-fitted figure (the
weight chosen on even user ids, read on odd ones, and vice versa): a fusion
variant is scored on the same questions without another replay.

    python -m bench.screen_loo ../shared/datasets/ml-100k [--settings JSON] [--dump F]

``--validate`` replays the dataset without each user's last view, so the questions
are the second-to-last views and the test views are never read: where a setting is
chosen before it is read on the test questions (``bench/momentum_screen.py``).

``--settings`` merges sections over the evaluation's, e.g.
``'{"features": {"history_in_model": 50}}'``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.evaluation import runner
from app.evaluation.metrics import recall_ndcg
from app.evaluation.stream import split_samples
from app.recommender import Recommender
from app.scoring.ranking import fuse, ranking_bonus
from app.wiring import eval_trainers
from feature_store.models.quality import roc_auc
from feature_store.runtime.resources import open_resources

K = 10


def record_rankings(into: list[dict[str, Any]]) -> None:
    """Wrap :meth:`Recommender._rank` so each ranked request appends its inputs to ``into``
    (the recommender exposes the probabilities to an observer, not the bonus terms)."""
    original = Recommender._rank

    def _rank(self: Recommender, request: Any, query: Any, found: Any, scores: np.ndarray,
              learned: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None],
              *rest: Any) -> Any:
        ranked = original(self, request, query, found, scores, learned, *rest)
        covisits = found.pool.covisits or {}
        affinity, sequence, factorized = learned
        into.append({
            "ids": list(found.ids),
            "probability": np.asarray(scores, np.float64).copy(),
            "reranked": np.asarray(ranked.scores, np.float64).copy(),
            "affinity": None if affinity is None else np.asarray(affinity, np.float64).copy(),
            "covisits": np.array([covisits.get(v, 0.0) for v in found.ids], np.float64),
            "sequence": None if sequence is None else np.asarray(sequence, np.float64).copy(),
            "factorized": None if factorized is None
            else np.asarray(factorized, np.float64).copy(),
        })
        return ranked

    Recommender._rank = _rank  # type: ignore[method-assign, assignment]


def hit_rate(rankings: list[dict[str, Any]], held: list[str], score: Any) -> float:
    """HR@K of ``score(ranking) -> array`` over the questions (ties: candidates' order)."""
    hits = 0
    for ranking, video in zip(rankings, held, strict=True):
        order = np.argsort(-score(ranking), kind="stable")
        position = ranking["ids"].index(video)
        hits += int(np.flatnonzero(order == position)[0]) < K
    return hits / max(1, len(held))


def fusion_grid(rankings: list[dict[str, Any]], held: list[str], sequence_weight: float,
                factorization_weight: float = 0.0) -> None:
    """The final ranking's HR@K for a grid of bonus weights (the reranked probabilities),
    the sequence and factorisation terms at their weights."""
    for retrieval in (0.0, 0.5, 1.0, 2.0):
        row = []
        for covisit in (0.0, 0.5, 1.0, 2.0):
            def score(r: dict[str, Any], w: float = retrieval, c: float = covisit) -> np.ndarray:
                bonus = ranking_bonus(len(r["ids"]), r["affinity"], r["covisits"], w, c,
                                      r.get("sequence"), sequence_weight,
                                      r.get("factorized"), factorization_weight)
                return fuse(r["reranked"], bonus)
            row.append(f"covisit {covisit}: {hit_rate(rankings, held, score):.4f}")
        print(f"retrieval {retrieval}:", ", ".join(row))


SEQUENCE_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def sequence_sweep(rankings: list[dict[str, Any]], held: list[str], even: np.ndarray,
                   weights: tuple[float, float], factorization_weight: float = 0.0
                   ) -> dict[str, Any]:
    """HR@K of the final ranking per ``api.sequence_weight`` (in sample, for reading), and
    cross-fitted: the weight chosen on the questions of even user ids read on the odd ones
    and vice versa, so the figure is never tuned on the questions it reports."""
    hits = np.zeros((len(SEQUENCE_WEIGHTS), len(held)), dtype=bool)
    for j, w in enumerate(SEQUENCE_WEIGHTS):
        for i, (r, video) in enumerate(zip(rankings, held, strict=True)):
            bonus = ranking_bonus(len(r["ids"]), r["affinity"], r["covisits"], *weights,
                                  r.get("sequence"), w, r.get("factorized"),
                                  factorization_weight)
            order = np.argsort(-fuse(r["reranked"], bonus), kind="stable")
            hits[j, i] = int(np.flatnonzero(order == r["ids"].index(video))[0]) < K
    crossed = np.zeros(len(held), dtype=bool)
    chosen = {}
    for name, pick, read in (("even", even, ~even), ("odd", ~even, even)):
        best = int(np.argmax(hits[:, pick].mean(axis=1)))
        chosen[name] = SEQUENCE_WEIGHTS[best]
        crossed[read] = hits[best, read]
    return {"sequence_weights": list(SEQUENCE_WEIGHTS),
            "in_sample_hr": [round(float(h.mean()), 4) for h in hits],
            "chosen_on": chosen, "cross_fitted_hr": round(float(crossed.mean()), 4)}


def replay_figures(samples: Any, queries: list[Any]) -> dict[str, float]:
    """The replay's figures, as ``vidrec eval``'s rows count them: the service's and the
    ranker alone's HR@K / NDCG@K over the questions, and the online AUC on the last 20%
    of the labelled rows."""
    weighted = samples.take(np.flatnonzero(samples.weights > 0).tolist())
    test = split_samples(weighted).test_rows
    last = np.array([e in test for e in weighted.event_ids])
    service = recall_ndcg([q.rank for q in queries], K)
    ranker = recall_ndcg([q.ranker_rank for q in queries], K)
    return {
        "service_hr": round(service[0], 4), "service_ndcg": round(service[1], 4),
        "ranker_hr": round(ranker[0], 4), "ranker_ndcg": round(ranker[1], 4),
        "online_auc_last20": round(roc_auc(weighted.scores[last], weighted.labels[last]), 4),
    }


def validation_copy(dataset: Path, into: Path) -> Path:
    """A MovieLens 100K directory in ``into`` without each user's last rating (by time,
    ties in file order; the replay then holds out the one before it): its other files linked, not
    copied (the data's license forbids redistributing it; this lives in a temp dir)."""
    if not (dataset / "u.data").is_file():
        raise SystemExit(f"--validate reads MovieLens 100K (u.data): not in {dataset}")
    into.mkdir()
    for item in dataset.iterdir():
        if item.name != "u.data":
            (into / item.name).symlink_to(item.resolve())
    rows = (dataset / "u.data").read_text(encoding="latin-1").splitlines()
    last: dict[str, int] = {}
    for i in sorted(range(len(rows)), key=lambda i: int(rows[i].split("\t")[3])):
        last[rows[i].split("\t")[0]] = i
    dropped = set(last.values())
    (into / "u.data").write_text(
        "".join(row + "\n" for i, row in enumerate(rows) if i not in dropped), encoding="latin-1")
    return into


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--settings", default="{}", help="settings sections (JSON) merged over eval's")
    p.add_argument("--full-ranking", action="store_true")
    p.add_argument("--dump", type=Path, default=None, help="per-question arrays (.npz)")
    p.add_argument("--limit", type=int, default=None, help="first events only (a smoke run)")
    p.add_argument("--catalog", type=Path, default=None, help="videos of a CSV dataset")
    p.add_argument("--validate", action="store_true",
                   help="ask each user's second-to-last view (the last never read)")
    args = p.parse_args()
    rankings: list[dict[str, Any]] = []
    record_rankings(rankings)
    cpu, wall = time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidrec-screen-") as tmp:
        dataset = validation_copy(args.dataset, Path(tmp) / "validation") if args.validate \
            else args.dataset
        cfg = runner.EvalConfig(dataset, protocol="loo", negatives=1, progress=False,
                                settings=json.loads(args.settings),
                                full_ranking=args.full_ranking, limit=args.limit,
                                catalog=args.catalog)
        stream, settings, queries = runner.prepare(cfg, Path(tmp))
        with open_resources(settings) as resources:
            resources.catalog.upsert(stream.videos)
            online = runner._Online(cfg, stream, resources, eval_trainers().replay)
            samples = online.run(queries)
    print(json.dumps({
        "settings": cfg.settings, "questions": len(queries), **replay_figures(samples, queries),
        "cpu_s": round(time.process_time() - cpu), "wall_s": round(time.perf_counter() - wall),
    }))
    held = [q.video for q in queries]
    if len(rankings) == len(queries):
        api = settings.api
        fusion_grid(rankings, held, api.sequence_weight, api.factorization_weight)
        even = np.array([int("".join(filter(str.isdigit, q.user)) or 0) % 2 == 0
                         for q in queries])
        print(json.dumps(sequence_sweep(rankings, held, even,
                                        (api.retrieval_weight, api.covisit_weight),
                                        api.factorization_weight)))
    if args.dump is not None:
        np.savez_compressed(args.dump, held=np.array(held),
                            users=np.array([q.user for q in queries]),
                            ts=np.array([q.ts for q in queries]),
                            rankings=np.array(rankings, dtype=object))


if __name__ == "__main__":
    main()
