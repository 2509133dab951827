"""How a new video's personal score should use the user's own history: the measurement.

    python bench/cold_start_variants.py [RESULTS ...]     # the probe's rows
    python bench/cold_start_variants.py --replay          # the demo world alone

Picks the form and the strength of :mod:`app.cold_start`'s own lift. Two
measurements, both against the demo world's known tastes:

- **the probe** (RESULTS: ``bench/results/personal-<backend>.json`` files of
  ``bench/bench_personal.py``, default the Kafka + Redis one): its *new
  videos by taste* rows hold, per (user, new video), the prior, the model's
  lift, the user's positive and negative entries in the video's category
  and overall, and the true play probability. Each variant's score is
  computed from those parts and scored as the probe scores the service:
  favourite first, pair agreement, cross-entropy
  (:func:`bench.bench_personal.taste_figures`);
- **a replay** (``--replay``): the demo world's own sessions (6,000, as 5
  minutes of the demo), no service; for every impression after the first
  1,500 sessions, the user's counts in the video's category so far predict
  whether they play it, from the category's play rate. Log-loss and the
  AUC within users (their categories ranked), the counts' part alone.

Variants (``q``: the prior moved by the model's lift, ``s``: the strength;
``own``: the shipped own lift, shares relative to the user's overall share):

- ``model lift``: ``q`` (before issue #21's own lift);
- ``own + lift``: ``logit q + own`` (what ships);
- ``own, lift fading``: ``logit prior + own + lift * s / (s + a + b)``;
- ``own only``: ``logit prior + own``;
- ``rate``: ``(s * q + a) / (s + a + b)``, the user's entries as impressions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_personal import taste_figures  # noqa: E402

STRENGTHS = (1, 2, 4, 8, 16)


def logit(p: Any) -> Any:
    return np.log(p / (1 - p))


def sigmoid(x: Any) -> Any:
    return 1 / (1 + np.exp(-x))


def share_lift(a: Any, b: Any, engaged: Any, decided: Any, s: float) -> Any:
    """``app.cold_start.own_lift`` at the category level (the probe's creators are new)."""
    overall = (engaged + 1) / (decided + 2)
    return logit((s * overall + a) / (s + a + b)) - logit(overall)


def probe(path: Path) -> None:
    rows = json.loads(path.read_text())["new_video_tastes"]["rows"]

    def own(r: dict[str, Any], s: float) -> float:
        decided = r["engaged_all"] + r["rejected_all"]
        return float(share_lift(r["engaged"], r["rejected"], r["engaged_all"], decided, s))

    def q(r: dict[str, Any]) -> float:
        return float(logit(r["prior"]) + (r["lift"] or 0.0))

    variants: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        ("model lift", lambda r: sigmoid(q(r)))
    ]
    for s in STRENGTHS:
        variants += [
            (f"own + lift, s={s}", lambda r, s=s: sigmoid(q(r) + own(r, s))),
            (f"own, lift fading, s={s}", lambda r, s=s: sigmoid(
                logit(r["prior"]) + own(r, s)
                + (r["lift"] or 0.0) * s / (s + r["engaged"] + r["rejected"]))),
            (f"own only, s={s}", lambda r, s=s: sigmoid(logit(r["prior"]) + own(r, s))),
            (f"rate, s={s}", lambda r, s=s: (s * sigmoid(q(r)) + r["engaged"])
             / (s + r["engaged"] + r["rejected"])),
        ]
    print(f"{path}: {len(rows)} rows, mean true play probability "  # noqa: T201
          f"{np.mean([r['truth'] for r in rows]):.3f}")
    for name, score in variants:
        scored = [{**r, "variant": score(r)} for r in rows]
        figures = taste_figures(scored, "variant")
        mean = np.mean([r["variant"] for r in scored])
        print(f"  {name:24s} favourite first {figures['favourite_first']:.3f}  "  # noqa: T201
              f"pairs {figures['pair_agreement']:.3f}  cross-entropy "
              f"{figures['cross_entropy']:.4f}  mean {mean:.3f}")


def replay(sessions: int = 6000, warm: int = 1500) -> None:
    from app.demo import DEMO_CONFIG
    from feature_store.sim.world import SyntheticWorld

    world = SyntheticWorld(DEMO_CONFIG)
    stream = world.sessions()
    logs = [next(stream) for _ in range(sessions)]
    shown, played = np.zeros(DEMO_CONFIG.categories), np.zeros(DEMO_CONFIG.categories)
    for events in logs:
        for e in events:
            cat = world.video_category[world.video_index(e.video_id)]
            shown[cat] += e.type == "impression"
            played[cat] += e.type == "play"
    rate = played / shown
    columns = (np.array(c, dtype=float) for c in zip(*replay_rows(world, logs, warm), strict=True))
    users, cats, a, b, engaged, rejected, y = columns
    prior = rate[cats.astype(int)]

    def report(name: str, p: Any) -> None:
        p = np.clip(p, 1e-6, 1 - 1e-6)
        loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        print(f"  {name:14s} log-loss {loss:.4f}  AUC within users "  # noqa: T201
              f"{auc_within(users, p, y):.4f}  mean {p.mean():.3f}")

    print(f"replay: {len(y)} impressions, play rate {y.mean():.3f}, "  # noqa: T201
          f"mean entries of the category {np.mean(a + b):.1f}")
    report("prior", prior)
    for s in STRENGTHS:
        report(f"own, s={s}", sigmoid(logit(prior)
                                      + share_lift(a, b, engaged, engaged + rejected, s)))
    for s in STRENGTHS:
        report(f"rate, s={s}", (s * prior + a) / (s + a + b))


def replay_rows(world: Any, logs: list[Any], warm: int) -> list[tuple[Any, ...]]:
    """Per impression after ``warm`` sessions: user, category, the user's positive and
    negative entries of it so far, of every category, and whether they played it."""
    counts: dict[str, np.ndarray] = defaultdict(lambda: np.zeros((2, world.config.categories)))
    rows = []
    for k, events in enumerate(logs):
        user = events[0].user_id
        by_video: dict[str, list[Any]] = defaultdict(list)
        for e in events:
            by_video[e.video_id].append(e)
        mine = counts[user]
        entries = []
        for vid, acts in by_video.items():
            cat = world.video_category[world.video_index(vid)]
            types = {e.type for e in acts}
            ratio = max([e.watch_ms / e.duration_ms for e in acts if e.type == "play"] or [0])
            if k >= warm:
                rows.append((int(user[1:]), cat, *mine[:, cat], *mine.sum(axis=1),
                             "play" in types))
            if ratio >= 0.5 or types & {"finish", "like"}:
                entries.append((0, cat))
            elif "skip" in types or ("play" in types and ratio < 0.1):
                entries.append((1, cat))
        for side, cat in entries:  # the history as a request after the session reads it
            mine[side, cat] += 1
    return rows


def auc_within(users: Any, scores: Any, y: Any) -> float:
    """AUC over the (played, not played) pairs of the same user (ties count half)."""
    from scipy.stats import rankdata

    hits = pairs = 0.0
    for user in np.unique(users):
        at = users == user
        yy, ranks = y[at], rankdata(scores[at])
        positives = yy.sum()
        negatives = len(yy) - positives
        hits += ranks[yy == 1].sum() - positives * (positives + 1) / 2
        pairs += positives * negatives
    return hits / pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path,
                        default=[ROOT / "bench" / "results" / "personal-redis-kafka.json"])
    parser.add_argument("--replay", action="store_true")
    args = parser.parse_args()
    if args.replay:
        replay()
    else:
        for path in args.results:
            probe(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
