"""Rerank and cold start: the share of slots new videos take, and what the rerank costs.

    python bench/bench_rerank.py [--requests 2000] [--candidates 500] [--count 20] [--seed 0]

Two generated scenarios, each ranked three ways in the same run: the plain
top-K by the model's scores (what the service did before the rerank), the
rerank with no exploration budget, and the rerank with the default budget
(``rerank.exploration_budget``):

- **issue**: the scenario of issue #12: 40 established videos in two
  categories, 3 just uploaded in a third that the model scores 0.92, 22
  users with history in one of the two, 20 items each (440 slots);
- **catalog**: 10,000 videos of which 5% have no engagement yet (the model
  scores their empty rows 0.5 to 0.95), ``--requests`` requests of
  ``--count`` items from ``--candidates`` candidates each, every user with a
  dislike, timing :meth:`app.rerank.Reranker.rerank` per request.

Prints the share of zero-engagement items per way, the rerank's p50 and p99
per request, the machine and its load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.cold_start import ColdStart  # noqa: E402
from app.rerank import Reranker  # noqa: E402
from app.scoring.video_table import VideoTable  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from feature_store.activity.base import VideoStats  # noqa: E402
from feature_store.catalog.base import Video  # noqa: E402
from feature_store.events import Event, EventType  # noqa: E402
from feature_store.settings import RerankSettings  # noqa: E402
from feature_store.signals.feedback import FeedbackParams, MemoryFeedback  # noqa: E402

NOW = 1_700_000_000_000


def video(video_id: str, category: str, creator: str) -> Video:
    return Video(video_id=video_id, creator_id=creator, category=category,
                 duration_ms=60_000, uploaded_at=NOW - 1000)


def table_of(videos: Sequence[Video], stats: Sequence[VideoStats]) -> tuple[VideoTable, np.ndarray]:
    table = VideoTable(coded=[], multi_lens={}, n_dense=0, describe=lambda v: ([], {}),
                       derive=lambda n, s: s)
    rows = table.rows_of(videos)
    table.set_stats(rows, stats)
    return table, rows


def rerankers(feedback: MemoryFeedback, seed: int) -> dict[str, Reranker | None]:
    default = RerankSettings()
    none = RerankSettings(exploration_budget=0.0)
    return {
        "plain top-K (before)": None,
        "rerank, no budget": Reranker(none, feedback, ColdStart(none, seed=seed)),
        f"rerank, budget {default.exploration_budget:.0%}": Reranker(
            default, feedback, ColdStart(default, seed=seed)
        ),
    }


def top(
    rr: Reranker | None, user: str, ids: list[str], table: VideoTable, rows: np.ndarray,
    scores: np.ndarray, count: int,
) -> tuple[list[int], float]:
    """Positions served, and the seconds the rerank took."""
    if rr is None:
        return np.argsort(-scores, kind="stable")[:count].tolist(), 0.0
    t0 = time.perf_counter()
    out, order = rr.rerank(user, NOW, (), None, ids, table, rows, scores, count)
    took = time.perf_counter() - t0
    return order.tolist(), took


def issue(seed: int) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    videos = [video(f"old{i}", ("news", "sport")[i % 2], f"c{i % 10}") for i in range(40)]
    stats = [VideoStats(impressions=200, plays=40 + i, finishes=20) for i in range(40)]
    videos += [video(f"new{i}", "cooking", "chef") for i in range(3)]
    stats += [VideoStats()] * 3
    table, rows = table_of(videos, stats)
    ids = [v.video_id for v in videos]
    out = {}
    for name, rr in rerankers(MemoryFeedback(FeedbackParams()), seed).items():
        new = slots = 0
        for user in range(22):
            favourite = ("news", "sport")[user % 2]
            scores = np.array([
                0.92 if v.video_id.startswith("new")
                else rng.uniform(0.5, 0.8) if v.category == favourite
                else rng.uniform(0.2, 0.4)
                for v in videos
            ], dtype=np.float32)
            served, _ = top(rr, f"u{user}", ids, table, rows, scores, 20)
            slots += len(served)
            new += sum(ids[i].startswith("new") for i in served)
        out[name] = f"{new} of {slots} slots ({new / slots:.1%})"
    return out


def catalog(requests: int, candidates: int, count: int, seed: int) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    n_videos, n_cold = 10_000, 500
    videos = [video(f"v{i}", f"k{i % 20}", f"c{i % 2000}") for i in range(n_videos)]
    shown = rng.integers(20, 2000, n_videos)
    stats = [
        VideoStats(impressions=int(s), plays=int(s * rng.uniform(0.05, 0.6)))
        if i >= n_cold else VideoStats(impressions=int(rng.integers(0, 10)))
        for i, s in enumerate(shown.tolist())
    ]
    table, all_rows = table_of(videos, stats)
    feedback = MemoryFeedback(FeedbackParams())
    feedback.record_events(
        [Event(event_id=f"d{u}", user_id=f"u{u}", video_id=f"v{u * 7 % n_videos}",
               type=EventType.DISLIKE, ts=NOW - 3600_000) for u in range(100)],
        {f"v{u * 7 % n_videos}": f"c{u * 7 % n_videos % 2000}" for u in range(100)},
    )
    out = {}
    for name, rr in rerankers(feedback, seed).items():
        cold = slots = 0
        took: list[float] = []
        for request in range(requests):
            pick = rng.choice(n_videos, size=candidates, replace=False)
            ids = [videos[i].video_id for i in pick.tolist()]
            scores = np.where(pick < n_cold, rng.uniform(0.5, 0.95, candidates),
                              rng.uniform(0.0, 0.9, candidates)).astype(np.float32)
            served, seconds = top(rr, f"u{request % 100}", ids, table, all_rows[pick],
                                  scores, count)
            took.append(seconds)
            slots += len(served)
            cold += sum(int(pick[i]) < n_cold for i in served)
        cost = (f"; rerank p50 {np.percentile(took, 50) * 1e3:.3f} ms, "
                f"p99 {np.percentile(took, 99) * 1e3:.3f} ms" if rr is not None else "")
        out[name] = f"{cold / slots:.1%} of {slots} slots{cost}"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("issue #12 scenario: slots taken by the 3 just-uploaded videos")
    for name, figure in issue(args.seed).items():
        print(f"  {name:24s} {figure}")
    print(f"catalog: zero-engagement share of served items ({args.requests} requests, "
          f"{args.candidates} candidates, {args.count} items)")
    for name, figure in catalog(args.requests, args.candidates, args.count, args.seed).items():
        print(f"  {name:24s} {figure}")
    print(f"machine: {cpu_model(platform.processor() or 'unknown CPU')}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
