"""A synthetic positive-only micro-video log for ``vidrec eval`` at scale (issue #24).

    python bench/generate_log.py --users 50000 --videos 19000 --interactions 360000 \\
        --out DIR [--topics 60] [--seed 0]

Writes ``DIR/events.csv`` (one ``finish`` per view, vidrec's events schema,
:mod:`feature_store.event_files`) and ``DIR/videos.csv`` (the catalog: each
video's topic as its category, a creator, a length of 8 to 90 s), which
``vidrec eval DIR/events.csv --catalog DIR/videos.csv --protocol loo
--negatives 1`` reads. Nothing is downloaded; the same seed writes the same
files byte for byte.

What makes users' tastes learnable, and the log look like a micro-video one:

- **topics**: every video belongs to one of ``--topics`` topics (sizes
  uneven, Zipf over topics); every user prefers 1 to 3 topics (Dirichlet
  weights) and takes 85% of their views from them, 15% from any topic by
  global popularity (exploration);
- **popularity skew**: within a topic, a video's chance goes as
  ``rank ** -0.7`` (a few hits, a long tail); the exploration views follow
  the same skew over the whole catalog;
- **sessions**: a view keeps the previous view's topic with probability 0.5
  (else its topic is drawn again from the user's; users binge a topic), so
  the order of a user's views says something;
- **activity**: views per user are long-tailed (a discrete Pareto of shape
  1.3 above the floor), between ``--min-views`` and ``--max-views``; the most
  active user has exactly ``--max-views`` and the total is exactly
  ``--interactions``. A user never views the same video twice;
- **time**: 28 days from 2026-01-05 00:00 UTC; each user starts at a
  uniform moment of the first 95%, views follow at exponential gaps of 8
  hours on average (squeezed into what is left of the 28 days when they
  would run past it; at least 2 minutes apart, so no two views merge into
  one within the trainer's join window), so users' last views, the
  leave-one-out questions, fall all along the log.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

START_MS = 1_767_571_200_000
"""2026-01-05 00:00 UTC: after ``limits.min_ts_ms`` (no shift) and before today."""
SPAN_MS = 28 * 86_400_000
MEAN_GAP_MS = 8 * 3_600_000
"""Mean time between two views of one user (ms) before the squeeze into the span."""
MIN_GAP_MS = 120_000
"""Least time between two views of one user (ms): more than the trainer's join window."""
EXPLORE = 0.15
"""Share of views drawn from the whole catalog by popularity instead of the user's topics."""
STAY = 0.5
"""Chance that a view keeps the previous view's topic (binge-watching a topic)."""
SKEW = 0.7
"""Zipf exponent of a video's popularity rank (within its topic and overall)."""

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LogShape:
    users: int
    videos: int
    interactions: int
    topics: int = 60
    min_views: int = 5
    max_views: int = 218
    seed: int = 0


def views_per_user(shape: LogShape, rng: np.random.Generator) -> Ints:
    """Long-tailed view counts in ``[min_views, max_views]`` summing to ``interactions``,
    the largest exactly ``max_views``."""
    lo, hi, n = shape.min_views, shape.max_views, shape.users
    if not lo * n <= shape.interactions <= hi * n or n < 1:
        raise SystemExit(f"{shape.interactions} views cannot be split among {n} users "
                         f"with {lo} to {hi} each")
    extra = rng.pareto(1.3, size=n)
    target = shape.interactions - lo * n
    counts = lo + np.minimum(np.floor(extra * target / max(extra.sum(), 1e-9)), hi - lo)
    counts = counts.astype(np.int64)
    counts[int(np.argmax(counts))] = hi
    # Land the total exactly: add or remove single views at random users with room.
    while (diff := shape.interactions - int(counts.sum())) != 0:
        room = counts < hi if diff > 0 else counts > lo
        room[int(np.argmax(counts))] = False  # the top user keeps max_views
        pick = rng.choice(np.flatnonzero(room), size=min(abs(diff), int(room.sum())),
                          replace=False)
        counts[pick] += 1 if diff > 0 else -1
    return counts


@dataclass
class Catalog:
    topic: Ints
    """Each video's topic."""
    members: list[Ints]
    """The videos of each topic, most popular first."""
    overall: Ints
    """Every video, most popular first (a random order of ids, so ids say nothing)."""
    cumulative: dict[int, npt.NDArray[np.float64]]
    """Cumulative popularity weights by list length (:func:`cumulative`)."""


def catalog(shape: LogShape, rng: np.random.Generator) -> Catalog:
    topic_weight = 1.0 / np.arange(1, shape.topics + 1) ** 0.6
    topic = rng.choice(shape.topics, size=shape.videos, p=topic_weight / topic_weight.sum())
    by_popularity = rng.permutation(shape.videos).astype(np.int64)
    members = [by_popularity[topic[by_popularity] == t] for t in range(shape.topics)]
    sizes = {len(m) for m in members} | {shape.videos}
    return Catalog(topic.astype(np.int64), members, by_popularity,
                   {n: cumulative(n) for n in sizes if n})


def cumulative(count: int) -> npt.NDArray[np.float64]:
    """Cumulative Zipf weights ``rank ** -SKEW`` of ``count`` videos, most popular first."""
    weights = 1.0 / np.arange(1, count + 1) ** SKEW
    return np.cumsum(weights) / weights.sum()


def _pick(rng: np.random.Generator, ranked: Ints, cum: npt.NDArray[np.float64],
          taken: set[int]) -> int:
    """A video of ``ranked`` (most popular first, ``cum`` its cumulative weights) by its
    weight, not in ``taken`` (-1 when none is free)."""
    for _ in range(32):
        video = int(ranked[min(int(np.searchsorted(cum, rng.random())), len(ranked) - 1)])
        if video not in taken:
            return video
    free = [int(v) for v in ranked if int(v) not in taken]
    return free[0] if free else -1


def user_views(count: int, shape: LogShape, videos: Catalog, rng: np.random.Generator
               ) -> list[int]:
    """One user's videos in viewing order (see the module doc)."""
    liked = rng.choice(shape.topics, size=int(rng.integers(1, 4)), replace=False)
    weights = rng.dirichlet(np.ones(len(liked)))
    overall, cum_all = videos.overall, videos.cumulative[shape.videos]
    taken: set[int] = set()
    out: list[int] = []
    topic = int(rng.choice(liked, p=weights))
    for _ in range(count):
        if rng.random() < EXPLORE:
            video = _pick(rng, overall, cum_all, taken)
        else:
            if rng.random() >= STAY:
                topic = int(rng.choice(liked, p=weights))
            ranked = videos.members[topic]
            video = _pick(rng, ranked, videos.cumulative[len(ranked)], taken) if len(ranked) else -1
            if video < 0:
                video = _pick(rng, overall, cum_all, taken)
        taken.add(video)
        out.append(video)
    return out


def view_times(count: int, rng: np.random.Generator) -> Ints:
    """One user's view times (ms), increasing, at least :data:`MIN_GAP_MS` apart: from a
    uniform start, gaps exponential of mean :data:`MEAN_GAP_MS`, squeezed into the rest of
    the span when they would run past it."""
    start = int(rng.integers(0, int(SPAN_MS * 0.95)))
    gaps = rng.exponential(MEAN_GAP_MS, size=count)
    gaps[0] = 0.0
    room = SPAN_MS - start - count * MIN_GAP_MS
    offsets = np.cumsum(gaps)
    if offsets[-1] > room:
        offsets *= max(room, 0) / offsets[-1]
    return START_MS + start + offsets.astype(np.int64) + np.arange(count) * MIN_GAP_MS


def generate(shape: LogShape, out: Path) -> tuple[int, int]:
    """Write ``events.csv`` and ``videos.csv`` under ``out``; returns (events, videos)."""
    rng = np.random.default_rng(shape.seed)
    videos = catalog(shape, rng)
    lengths = rng.integers(8_000, 90_001, size=shape.videos)
    counts = views_per_user(shape, rng)
    rows: list[tuple[int, int, int, int]] = []
    for user, count in enumerate(counts.tolist()):
        seen = user_views(count, shape, videos, rng)
        for k, (video, ts) in enumerate(zip(seen, view_times(count, rng).tolist(),
                                            strict=True)):
            rows.append((ts, user, video, k))
    rows.sort()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["event_id", "user_id", "video_id", "type", "ts", "watch_ms", "duration_ms"])
        for ts, user, video, k in rows:
            length = int(lengths[video])
            w.writerow([f"g{user}-{k}", f"u{user}", f"v{video}", "finish", ts, length, length])
    with open(out / "videos.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["video_id", "creator_id", "category", "duration_ms", "uploaded_at"])
        creators = rng.integers(0, max(1, shape.videos // 8), size=shape.videos)
        for video in range(shape.videos):
            w.writerow([f"v{video}", f"c{int(creators[video])}", f"topic{int(videos.topic[video])}",
                        int(lengths[video]), START_MS - 86_400_000])
    return len(rows), shape.videos


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=50_000)
    p.add_argument("--videos", type=int, default=19_000)
    p.add_argument("--interactions", type=int, default=360_000)
    p.add_argument("--topics", type=int, default=60)
    p.add_argument("--min-views", type=int, default=5)
    p.add_argument("--max-views", type=int, default=218)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    shape = LogShape(args.users, args.videos, args.interactions, args.topics,
                     args.min_views, args.max_views, args.seed)
    t0 = time.perf_counter()
    events, videos = generate(shape, args.out)
    print(f"{events:,} views of {videos:,} videos by {shape.users:,} users in "
          f"{args.out} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
