"""Screening a second signal for the final ranking: a SASRec-style next-video tower, point in time.

Issue #21's last unmeasured lever. A causal transformer over each user's views
(item embeddings + learned positions, causal self-attention blocks, the
output scored against the item embeddings, tied; Kang and McAuley, 2018),
trained on next-view prediction with a softmax over the catalog, then its score
fused into the service's final ranking, on the very questions and candidates
of ``vidrec eval DATASET --protocol loo --negatives 1``.

Point in time, as the matrix-factorisation baseline (:mod:`app.evaluation.factorization`):

- the replayed log and the questions are :func:`app.evaluation.runner.prepare`'s
  (each user's last view held out of the log, the question asked
  :data:`~app.evaluation.feed.IMPRESSION_LEAD_MS` before it, with the 99
  sampled videos the user never touched); the views are the log's
  positive rows (every MovieLens rating one ``finish``; the impressions the
  feed adds are not views), in log order;
- the tower is refit (warm-started: the same network and optimiser, trained
  ``--epochs`` more passes over every view before the refit point) at a
  question when the views since the last refit reach ``--refit-every`` or a
  tenth of those fitted on, whichever is fewer (ALS's rule); a question at log
  position ``p`` is scored with the newest fit made on ``events[:p]`` and the
  user's views in ``events[:p]`` (the newest ``--max-len``). Nothing at or
  after the question's moment is read; :func:`check_point_in_time` asserts it
  for every question, and that the held-out (user, video) is in no fit.

Fusion (``--dump`` from ``python -m bench.screen_loo DATASET --dump F.npz``, the
same questions in the same order, checked): the service's final score is
``fuse(reranked, ranking_bonus(...))`` with the evaluation's weights; the
tower adds ``w * term`` for three forms of term (the tower's logits standardised
over the request's candidates, its log-softmax over them, ``-log1p(rank)``).
The form and ``w`` are chosen on the questions of even user ids and the
figure read on the odd ones, and vice versa; the cross-fitted figure counts
each question under the choice made on the other half, so no figure is tuned on
the questions it reports.

Controls: ``--control random-items`` trains on the same users, moments and
lengths with every view's video replaced by a uniform draw from the catalog
(seeded): a tower that learns nothing true must rank at chance (HR@10 about
0.10) whatever its scoring reads; ``--control none`` is the real run. The
report also ranks a random candidate in place of the held-out one (the
label-shuffled figure, again about 0.10).

``--validate`` asks instead each user's *second-to-last* view (the last one
of the replayed log) among 99 videos the user never touched anywhere, the
test views never read: for choosing the tower's settings without the test.

    python -m bench.seq_tower_screen DATASET [--dump F.npz] [--validate] [--control ...]

Figures (ml-100k, 943 questions, the defaults, 2026-11-28, shared 2-core machine at load
3-5; dump of main at dafc5ad: service HR@10 0.5790 / NDCG@10 0.3179): the tower alone
0.6023 / 0.3410 (seed 1: 0.5907 / 0.3410); fused, cross-fitted over even / odd user ids,
0.6129 / 0.3535 (seed 1: 0.6161 / 0.3564), +0.034 / +0.037 of HR@10 over the service paired
(one standard error 0.013-0.014); the random-items control 0.1007 alone and +0.003 fused.
About 300 s of CPU (one thread), 95% of it the 33 refits.

Those figures were measured with this script's own copy of the network (its
attention ``nn.MultiheadAttention``); the network is now the service's,
:class:`trainer.sequence.SequenceTower` (the same attention written out for
the ONNX export, initialised differently), so a run today differs by the
seed's spread (0.57-0.60 alone on four runs). Since the tower is built in,
the dump's service scores include its term (``api.sequence_weight``): the
"service" here is no longer the pooled-history service.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional

from app.evaluation import runner
from app.evaluation.feed import IMPRESSION_LEAD_MS, POSITIVE_TYPES, Sampler, touched_by_user
from app.scoring.ranking import fuse, ranking_bonus
from feature_store.events import Event
from feature_store.models.sequence_io import left_padded
from feature_store.settings import SequenceSettings
from trainer.sequence import SequenceTower, windows

K = 10
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Question:
    user: str
    video: str
    position: int
    """Index in the replayed log of the first event at or after the question's moment."""
    ts: int
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class TowerParams:
    """The tower's settings; the defaults are the best of five tried on ``--validate``
    (second-to-last views, ml-100k, 2026-11-28; tower alone HR@10 there):
    1 epoch per refit every 2,000 views at lr 1e-3 0.4995; 3 epochs / 4,000 views
    0.5811; 6 / 6,000 0.6066; 6 / 6,000 at lr 3e-3 **0.6373**; 10 / 8,000 at 3e-3
    0.6320. More training per refit was the lever; the test was not read to choose."""

    dim: int = 64
    blocks: int = 2
    heads: int = 1
    max_len: int = 50
    dropout: float = 0.2
    lr: float = 3e-3
    batch: int = 128
    epochs: int = 6
    """Passes over every view before the refit point, per refit (warm start)."""
    refit_every: int = 6000
    """Views between refits at most (fewer early: a tenth of those fitted on)."""
    min_refit: int = 1000
    """Views between refits at least (the first fits: a tenth of a few views is none)."""


class Trainer:
    """The tower, its optimiser and the views it may read (those appended so far)."""

    def __init__(self, items: int, p: TowerParams, seed: int) -> None:
        torch.manual_seed(seed)
        self.p = p
        self.model = SequenceTower(items, SequenceSettings(
            dim=p.dim, blocks=p.blocks, heads=p.heads, max_len=p.max_len, dropout=p.dropout))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=p.lr)
        self.rng = np.random.default_rng(seed)
        self.views: dict[int, list[int]] = {}
        self.count = 0
        self.fitted = 0
        self.fits = 0
        self.steps = 0

    def add(self, user: int, item: int) -> None:
        self.views.setdefault(user, []).append(item)
        self.count += 1

    def stale(self) -> bool:
        due = max(self.p.min_refit, min(self.p.refit_every, self.fitted // 10))
        return self.fits == 0 or self.count - self.fitted >= due

    def refit(self) -> None:
        data = [w for v in self.views.values() for w in windows(v, self.p.max_len)]
        self.model.train()
        for _ in range(self.p.epochs):
            order = self.rng.permutation(len(data)).tolist()
            for start in range(0, len(data), self.p.batch):
                self._step([data[i] for i in order[start:start + self.p.batch]])
        self.fitted, self.fits = self.count, self.fits + 1

    def _step(self, chunk: list[tuple[list[int], list[int]]]) -> None:
        length = max(len(x) for x, _ in chunk)
        seq = torch.from_numpy(left_padded([x for x, _ in chunk], length))
        target = torch.from_numpy(left_padded([y for _, y in chunk], length))
        states = self.model(seq)[target > 0]
        logits = states @ self.model.item.weight[1:].T
        loss = functional.cross_entropy(logits, target[target > 0] - 1)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.steps += 1

    @torch.no_grad()
    def score(self, user: int, candidates: Ints) -> npt.NDArray[np.float64]:
        """The tower's logit of each candidate code for the user's views so far (all 0
        without any: ties, the candidates' random order)."""
        mine = self.views.get(user, [])
        if not mine:
            return np.zeros(len(candidates))
        self.model.eval()
        length = min(len(mine), self.p.max_len)
        state = self.model(torch.from_numpy(left_padded([mine[-length:]], length)))
        last = state[0, -1]
        emb = self.model.item.weight[torch.from_numpy(candidates)]
        return (emb @ last).double().numpy()


def views_of(events: Sequence[Event]) -> list[tuple[int, Event]]:
    """The log's views (positive rows), with their index in the log."""
    return [(i, e) for i, e in enumerate(events) if e.type in POSITIVE_TYPES]


def test_questions(queries: Sequence[runner.Query]) -> list[Question]:
    return [Question(q.user, q.video, q.position, q.ts, q.candidates) for q in queries]


def validation_questions(events: list[Event], touched: dict[str, set[str]], pool: list[str],
                         candidates: int, seed: int) -> tuple[list[Event], list[Question]]:
    """Each user's last view of the replayed log (their second-to-last) held out and
    asked among ``candidates`` videos the user never touched in the whole log."""
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for i, e in views_of(events):
        last[e.user_id] = i
        count[e.user_id] = count.get(e.user_id, 0) + 1
    sampler = Sampler(pool, seed)
    held = sorted((last[u] for u, c in count.items() if c >= 2), key=lambda i: events[i].ts)
    dropped = set(held)
    kept = [e for i, e in enumerate(events) if i not in dropped]
    times = [e.ts for e in kept]
    out = []
    for i in held:
        e = events[i]
        others = sampler.untouched(touched[e.user_id], candidates)
        at = e.ts - IMPRESSION_LEAD_MS
        out.append(Question(e.user_id, e.video_id, bisect.bisect_left(times, at), at,
                            sampler.shuffled([e.video_id, *others])))
    return kept, out


def check_point_in_time(events: Sequence[Event], questions: Sequence[Question]) -> None:
    """Every event a question's fit or sequence may read is before its moment, and the
    held-out (user, video) is nowhere in the replayed log's views."""
    seen = {(e.user_id, e.video_id) for _, e in views_of(events)}
    for q in questions:
        assert q.position == 0 or events[q.position - 1].ts < q.ts, q
        assert q.position == len(events) or events[q.position].ts >= q.ts, q
        assert (q.user, q.video) not in seen, q
        assert q.video in q.candidates, q


def replay(events: Sequence[Event], questions: Sequence[Question], codes: dict[str, int],
           p: TowerParams, seed: int, control: str) -> tuple[list[npt.NDArray[np.float64]],
                                                         dict[str, Any]]:
    """The tower's scores of each question's candidates (in the candidates' order)."""
    rng = np.random.default_rng(seed + 1)
    users: dict[str, int] = {}
    trainer = Trainer(len(codes), p, seed)
    stream = views_of(events)
    cursor = 0
    scores = []
    fit_cpu = 0.0
    for q in questions:
        while cursor < len(stream) and stream[cursor][0] < q.position:
            e = stream[cursor][1]
            item = codes[e.video_id] if control == "none" else int(rng.integers(1, len(codes) + 1))
            trainer.add(users.setdefault(e.user_id, len(users)), item)
            cursor += 1
        if trainer.stale():
            t0 = time.process_time()
            trainer.refit()
            fit_cpu += time.process_time() - t0
        user = users.get(q.user, -1)
        scores.append(trainer.score(user, np.array([codes[c] for c in q.candidates])))
    return scores, {"fits": trainer.fits, "steps": trainer.steps, "fit_cpu_s": round(fit_cpu, 1),
                    "views_fitted_last": trainer.fitted}


def ranks_of(scores: npt.NDArray[np.float64], target: int) -> int:
    """0-based rank of position ``target`` by descending score (ties: earlier first)."""
    order = np.argsort(-scores, kind="stable")
    return int(np.flatnonzero(order == target)[0])


def hr_ndcg(ranks: Sequence[int] | Ints) -> tuple[float, float]:
    r = np.asarray(ranks)
    hit = r < K
    return float(hit.mean()), float((hit / np.log2(r + 2)).mean())


def tower_terms(tower: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
    """The three forms of the tower's term over one request's candidates."""
    std = tower.std()
    z = (tower - tower.mean()) / std if std > 0 else np.zeros_like(tower)
    shifted = tower - tower.max()
    log_softmax = shifted - np.log(np.exp(shifted).sum())
    rank = np.empty(len(tower))
    rank[np.argsort(-tower, kind="stable")] = np.arange(len(tower))
    return {"z": z, "log_softmax": log_softmax, "rank": -np.log1p(rank)}


WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass
class Fused:
    """Per question: the held-out's 0-based rank under each (form, weight)."""

    ranks: dict[tuple[str, float], Ints]
    service: Ints
    tower: Ints


def fusion_ranks(rankings: Sequence[dict[str, Any]], questions: Sequence[Question],
                 tower: Sequence[npt.NDArray[np.float64]], weights: tuple[float, float]
                 ) -> Fused:
    ranks: dict[tuple[str, float], list[int]] = {}
    service, alone = [], []
    for r, q, t in zip(rankings, questions, tower, strict=True):
        ids = list(r["ids"])
        at = {c: i for i, c in enumerate(q.candidates)}
        mine = t[[at[c] for c in ids]]  # the tower's scores in the service's order
        final = fuse(r["reranked"], ranking_bonus(len(ids), r["affinity"], r["covisits"],
                                                  *weights))
        target = ids.index(q.video)
        service.append(ranks_of(final, target))
        alone.append(ranks_of(mine, target))
        for form, term in tower_terms(mine).items():
            for w in WEIGHTS:
                ranks.setdefault((form, w), []).append(ranks_of(final + w * term, target))
    return Fused({k: np.array(v) for k, v in ranks.items()}, np.array(service), np.array(alone))


def cross_fit(fused: Fused, even: npt.NDArray[np.bool_]) -> dict[str, Any]:
    """Form and weight chosen on one half (best HR@10, then NDCG@10), read on the other."""
    out: dict[str, Any] = {}
    crossed = np.empty(len(even), dtype=np.int64)
    for name, pick, read in (("even->odd", even, ~even), ("odd->even", ~even, even)):
        best = max(fused.ranks, key=lambda k: hr_ndcg(fused.ranks[k][pick]))
        crossed[read] = fused.ranks[best][read]
        out[name] = {"chosen": best,
                     "chosen_on_pick_hr": round(hr_ndcg(fused.ranks[best][pick])[0], 4),
                     "read_hr_ndcg": [round(x, 4) for x in hr_ndcg(fused.ranks[best][read])],
                     "service_read_hr": round(hr_ndcg(fused.service[read])[0], 4)}
    per_form = {}
    for form in ("z", "log_softmax", "rank"):
        fc = np.empty(len(even), dtype=np.int64)
        for pick, read in ((even, ~even), (~even, even)):
            w = best_weight(fused, form, pick)
            fc[read] = fused.ranks[(form, w)][read]
        per_form[form] = [round(x, 4) for x in hr_ndcg(fc)]
    out["cross_fitted_hr_ndcg"] = [round(x, 4) for x in hr_ndcg(crossed)]
    out["per_form_cross_fitted"] = per_form
    diff = (crossed < K).astype(float) - (fused.service < K).astype(float)
    out["paired_gain_hr"] = round(float(diff.mean()), 4)
    out["paired_gain_se"] = round(float(diff.std(ddof=1) / math.sqrt(len(diff))), 4)
    out["gained_lost"] = [int((diff > 0).sum()), int((diff < 0).sum())]
    return out


def best_weight(fused: Fused, form: str, pick: npt.NDArray[np.bool_]) -> float:
    return max(WEIGHTS, key=lambda w: hr_ndcg(fused.ranks[(form, w)][pick]))


def grid(fused: Fused) -> dict[str, list[float]]:
    """HR@10 over all questions per form and weight (in-sample: for reading, not choosing)."""
    return {form: [round(hr_ndcg(fused.ranks[(form, w)])[0], 4) for w in WEIGHTS]
            for form in ("z", "log_softmax", "rank")}


def load_dump(path: Path, questions: Sequence[Question]) -> list[dict[str, Any]]:
    dump = np.load(path, allow_pickle=True)
    users, held = list(dump["users"]), list(dump["held"])
    assert users == [q.user for q in questions] and held == [q.video for q in questions], \
        "the dump's questions are not these"
    return list(dump["rankings"])


def views_before(events: Sequence[Event], questions: Sequence[Question]) -> Ints:
    """Per question, the views its held-out video had in the log before the question."""
    order = sorted(range(len(questions)), key=lambda k: questions[k].position)
    seen: dict[str, int] = {}
    counts = np.zeros(len(questions), dtype=np.int64)
    views, at = views_of(events), 0
    for k in order:
        while at < len(views) and views[at][0] < questions[k].position:
            video = views[at][1].video_id
            seen[video] = seen.get(video, 0) + 1
            at += 1
        counts[k] = seen.get(questions[k].video, 0)
    return counts


def by_views(fused: Fused, counts: Ints) -> dict[str, Any]:
    """HR@10 of the service and of the tower alone by the held-out video's views before the
    question, and how often either of them hits (the ceiling of a per-question choice)."""
    service, tower = fused.service < K, fused.tower < K
    out: dict[str, Any] = {"either_hr": round(float((service | tower).mean()), 4)}
    for name, low, high in (("under_20", 0, 20), ("20_to_49", 20, 50), ("50_or_more", 50, None)):
        inside = (counts >= low) & (counts < high if high is not None else True)
        out[name] = {"questions": int(inside.sum()),
                     "service_hr": round(float(service[inside].mean()), 3),
                     "tower_hr": round(float(tower[inside].mean()), 3)}
    return out


def fusion_report(rankings: list[dict[str, Any]], questions: Sequence[Question],
                  scores: Sequence[npt.NDArray[np.float64]], weights: tuple[float, float],
                  events: Sequence[Event]) -> dict[str, Any]:
    fused = fusion_ranks(rankings, questions, scores, weights)
    even = np.array([int(q.user.removeprefix("ml")) % 2 == 0 for q in questions])
    return {"service_hr_ndcg": [round(x, 4) for x in hr_ndcg(fused.service)],
            "tower_on_service_candidates_hr_ndcg": [round(x, 4) for x in hr_ndcg(fused.tower)],
            "weights": list(WEIGHTS), "in_sample_grid_hr": grid(fused),
            **cross_fit(fused, even),
            "by_views_before": by_views(fused, views_before(events, questions))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--dump", type=Path, default=None, help="bench.screen_loo's --dump file")
    p.add_argument("--validate", action="store_true", help="ask second-to-last views instead")
    p.add_argument("--control", choices=("none", "random-items"), default="none")
    p.add_argument("--params", default="{}", help="TowerParams fields (JSON)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--save-scores", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    params = TowerParams(**json.loads(args.params))
    cpu, wall, load0 = time.process_time(), time.perf_counter(), os.getloadavg()
    cfg = runner.EvalConfig(args.dataset, protocol="loo", negatives=1, progress=False)
    with tempfile.TemporaryDirectory(prefix="vidrec-seqtower-") as tmp:
        stream, settings, queries = runner.prepare(cfg, Path(tmp), announce=False)
    events = stream.events
    questions = test_questions(queries)
    codes = {v: i + 1 for i, v in enumerate(sorted(v.video_id for v in stream.videos))}
    if args.validate:
        touched = touched_by_user([e for _, e in views_of(events)])
        for q in questions:  # the test views: never a validation candidate either
            touched.setdefault(q.user, set()).add(q.video)
        events, questions = validation_questions(events, touched, sorted(codes), 99, cfg.seed + 7)
    check_point_in_time(events, questions)
    scores, info = replay(events, questions, codes, params, args.seed, args.control)
    targets = [q.candidates.index(q.video) for q in questions]
    ranks = [ranks_of(s, t) for s, t in zip(scores, targets, strict=True)]
    shuffle = np.random.default_rng(args.seed + 2)
    label_shuffled = [ranks_of(s, int(shuffle.integers(len(s)))) for s in scores]
    no_history = sum(1 for s in scores if not s.any())
    report: dict[str, Any] = {
        "mode": "validation" if args.validate else "test", "control": args.control,
        "params": params.__dict__, "questions": len(questions), "no_history": no_history,
        "tower_hr_ndcg": [round(x, 4) for x in hr_ndcg(ranks)],
        "label_shuffled_hr_ndcg": [round(x, 4) for x in hr_ndcg(label_shuffled)], **info,
    }
    if args.dump is not None and not args.validate:
        weights = (settings.api.retrieval_weight, settings.api.covisit_weight)
        report["fusion"] = fusion_report(load_dump(args.dump, questions), questions, scores,
                                         weights, events)
    if args.save_scores is not None:
        np.savez_compressed(args.save_scores, users=np.array([q.user for q in questions]),
                            scores=np.array(scores, dtype=object))
    report.update({"cpu_s": round(time.process_time() - cpu), "wall_s": round(
        time.perf_counter() - wall), "load_start_end": [round(load0[0], 2),
                                                         round(os.getloadavg()[0], 2)]})
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
