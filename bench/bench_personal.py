"""Personal feeds: does a user's own feed follow that user, and how soon?

    python bench/bench_personal.py [--minutes 5] [--sessions-per-s 5] [--backend memory|redis-kafka]

Runs what ``./scripts/up`` runs (the service with the embedded trainer, the
demo world's catalog and simulated users at the demo's traffic level, the
demo's settings) for ``--minutes``, then probes it as a person would:

- **personalisation**: per report window, the share of recommended videos in
  the simulated user's three favourite categories, beside a popularity
  recommender's (the trending page) for the same users; and the live model's
  prequential AUC beside its popularity baseline (the trainer's figures);
- **pools**: the share of the 30 most active users' candidate pools proposed by
  the sources that read a history (towers, co-visitation, categories, creators);
- **identical scores**: for 100 catalog videos as candidates, the share that
  score exactly the same for a demo user with a long history and a brand-new
  user;
- **opposite tastes**: two new users, one finishes and likes six videos of
  category A and skips three of B (15 events), the other the reverse; from
  the API's 200 on their events, the seconds until their top 10s among 40
  unseen videos of A and B lean their own ways (the first holds at least
  :data:`GAP` more videos of A than the second), and how far the same top 10
  of a third, event-less user moved;
- **new videos**: a video uploaded now in A and one in B, each user's scores
  for the two (a brand-new video of a loved category should come first);
- **new videos by taste**: one video uploaded now in each category (new
  creators), scored for the 60 most active demo users: how often a user's
  best-scored one lies in their three favourite categories, the share of
  category pairs ordered as the user's true play probabilities order them,
  and the cross-entropy of the scores against those probabilities (a video of
  average quality shown first: ``sigmoid(1.6 * (1.4 * taste + bias) - 1.2)``,
  :mod:`feature_store.sim.world`); the same figures for the prior moved by
  the model's lift alone (the score before issue #21's own-evidence step,
  from each item's explanation), and per item the parts, to compare variants.

Prints one JSON document and writes ``bench/results/personal-<backend>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from feature_store.settings import Settings  # noqa: E402

KEY = {"X-API-Key": "vidrec-dev-key"}
TOP = 10
GAP = 4
"""The two users' top 10s lean their own ways when the one who likes A has this many
more videos of A in it than the one who likes B."""


def backend_settings(backend: str) -> tuple[dict[str, Any], list[Any]]:
    """Settings sections and the started services of ``backend``."""
    if backend == "memory":
        return {}, []
    from tests.services import RedisServer, TansuBroker

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import feature_store.eventlog.kafka  # noqa: F401
    redis_server, broker = RedisServer(), TansuBroker()
    redis_server.start()
    broker.start()
    return {
        "redis": {"url": redis_server.url},
        "sparse": {"backend": "redis"},
        "stores": {"backend": "redis"},
        "event_log": {"backend": "kafka", "topic_namespace": f"pers{uuid.uuid4().hex[:6]}"},
        "kafka": {"bootstrap_servers": broker.bootstrap, "partitions": 2},
    }, [redis_server, broker]


def run_traffic(demo: Any, minutes: float, rate: float) -> list[dict[str, Any]]:
    """Demo sessions at ``rate`` per second for ``minutes``; the figures of each minute.

    Counted here from each session's events (its impressions are what was shown),
    the way ``app.demo`` counts them, so that the same script measures code from
    before the demo counted anything.
    """
    world = demo.world
    windows: list[dict[str, Any]] = []
    counts = np.zeros(4)  # shown, in favourites, popular shown, popular in favourites
    end = time.monotonic() + minutes * 60
    next_report = time.monotonic() + 60
    next_session = time.monotonic()
    while time.monotonic() < end:
        now = time.monotonic()
        if now < next_session:
            time.sleep(next_session - now)
        next_session += 1.0 / rate
        events = demo.session()
        user = int(events[0].user_id[1:])
        favourites = set(np.argsort(-world.user_taste[user])[:3].tolist())
        shown = [int(e.video_id[1:]) for e in events if e.type == "impression"]
        trending = [v for v, _ in demo.service.signals.trending(40)]
        popular = [int(v[1:]) for v in trending if v[1:].isdigit()][: len(shown)]
        counts += [
            len(shown), sum(int(world.video_category[v]) in favourites for v in shown),
            len(popular), sum(int(world.video_category[v]) in favourites for v in popular),
        ]
        if time.monotonic() >= next_report:
            trainer = (demo.service.trainer.status().get("metrics") or {})
            windows.append({
                "minute": len(windows) + 1,
                "favourite_share": round(counts[1] / max(1, counts[0]), 4),
                "popular_favourite_share": round(counts[3] / max(1, counts[2]), 4),
                "auc": trainer.get("auc"),
                "baseline_auc": trainer.get("baseline_auc"),
                "model": demo.service.model.version if demo.service.model else None,
            })
            print(json.dumps(windows[-1]), flush=True)  # noqa: T201
            counts[:] = 0
            next_report += 60
    return windows


def scores_of(service: Any, user: str, candidates: list[str]) -> dict[str, float]:
    from app.schemas import RecommendRequest

    response = service.recommender.recommend(
        RecommendRequest(user_id=user, candidates=candidates, count=len(candidates))
    )
    return {item.video_id: item.score for item in response.items}


def served_version(service: Any) -> str | None:
    """The model version the service is serving now."""
    model = service.recommender.holder.current
    return None if model is None else str(model.version)


def top(service: Any, user: str, candidates: list[str]) -> list[str]:
    from app.schemas import RecommendRequest

    response = service.recommender.recommend(
        RecommendRequest(user_id=user, candidates=candidates, count=TOP)
    )
    return [item.video_id for item in response.items]


def probe_identical(service: Any, demo: Any) -> dict[str, Any]:
    """Share of 100 catalog videos scored the same for a long-history and a new user."""
    world = demo.world
    candidates = [f"v{i}" for i in range(0, world.config.videos, world.config.videos // 100)]
    active = int(np.argmax(world.user_activity))
    long_user = world.user_id(active)
    history = service.resources.activity.history(long_user)
    a = scores_of(service, long_user, candidates)
    b = scores_of(service, f"new-{uuid.uuid4().hex[:8]}", candidates)
    common = sorted(set(a) & set(b))
    same = sum(abs(a[v] - b[v]) < 1e-6 for v in common)
    return {"candidates": len(common), "identical": same,
            "identical_share": same / max(1, len(common)), "long_user_history": len(history)}


def probe_pools(service: Any, demo: Any, users: int = 30) -> dict[str, Any] | None:
    """Where the candidates of the most active demo users come from: the share of their
    pools (the first ``api.max_candidates``) proposed by the sources that read a history."""
    from app.candidates.sources import PERSONAL
    from app.schemas import RecommendRequest

    world = demo.world
    cap = service.resources.settings.api.max_candidates
    shares, counts = [], {}
    for user in np.argsort(-world.user_activity)[:users].tolist():
        pool = service.recommender.pool(RecommendRequest(user_id=world.user_id(user)))
        first = pool.sources[:cap]
        shares.append(sum(s in PERSONAL for s in first) / max(1, len(first)))
        for s in first:
            counts[s] = counts.get(s, 0) + 1
    return {"users": users, "personal_share": round(float(np.mean(shares)), 4),
            "by_source": counts}


def probe_opposite(client: Any, service: Any, demo: Any) -> dict[str, Any]:
    """Two new users with opposite tastes in two categories, and a bystander."""
    world = demo.world
    counts = np.bincount(world.video_category, minlength=world.config.categories)
    cat_a, cat_b = (int(c) for c in np.argsort(-counts)[:2])
    rng = np.random.default_rng(11)
    of_a = rng.permutation(np.flatnonzero(world.video_category == cat_a)).tolist()
    of_b = rng.permutation(np.flatnonzero(world.video_category == cat_b)).tolist()
    acted_a, acted_b = of_a[:6], of_b[:6]
    pool = [f"v{i}" for i in of_a[6:26] + of_b[6:26]]
    in_a = {f"v{i}" for i in of_a}
    x, y, z = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("likes-a", "likes-b", "bystander"))
    version_before = served_version(service)
    before_z = top(service, z, pool)
    before_scores_z = scores_of(service, z, pool)

    def events(user: str, loved: list[int], skipped: list[int]) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        out: list[dict[str, Any]] = []
        for j, v in enumerate(loved):
            duration = int(world.video_duration_ms[v])
            out.append({"event_id": f"{user}-f{j}", "user_id": user, "video_id": f"v{v}",
                        "type": "finish", "ts": now - 60_000 + j * 1000, "watch_ms": duration,
                        "duration_ms": duration})
            out.append({"event_id": f"{user}-l{j}", "user_id": user, "video_id": f"v{v}",
                        "type": "like", "ts": now - 60_000 + j * 1000 + 500})
        for j, v in enumerate(skipped[:3]):
            out.append({"event_id": f"{user}-s{j}", "user_id": user, "video_id": f"v{v}",
                        "type": "skip", "ts": now - 30_000 + j * 1000})
        return out

    sent = events(x, acted_a, acted_b) + events(y, acted_b, acted_a)
    response = client.post("/v1/events", json={"events": sent}, headers=KEY)
    accepted = time.perf_counter()
    assert response.status_code == 200, response.text
    apart: float | None = None
    tops: dict[str, list[str]] = {}
    while time.perf_counter() - accepted < 60:
        tops = {user: top(service, user, pool) for user in (x, y)}
        if sum(v in in_a for v in tops[x]) - sum(v in in_a for v in tops[y]) >= GAP:
            apart = time.perf_counter() - accepted
            break
        time.sleep(0.05)
    after_z = top(service, z, pool)
    after_scores_z = scores_of(service, z, pool)
    version_after = served_version(service)
    moved = max(abs(after_scores_z[v] - before_scores_z[v]) for v in pool
                if v in after_scores_z and v in before_scores_z)
    return {
        "events_per_user": len(sent) // 2,
        "seconds_until_apart": apart,
        "top10_in_a": {"likes_a": sum(v in in_a for v in tops[x]),
                       "likes_b": sum(v in in_a for v in tops[y]),
                       "bystander_before": sum(v in in_a for v in before_z),
                       "bystander_after": sum(v in in_a for v in after_z)},
        "bystander_top10_unchanged": before_z == after_z,
        "bystander_max_score_change": moved,
        # An export landing between the two reads moves everyone's scores (the model
        # learnt from everybody): then the bystander's change says nothing of the users'.
        "model_swapped_meanwhile": version_before != version_after,
        "users": {"likes_a": x, "likes_b": y, "categories": [f"cat{cat_a}", f"cat{cat_b}"]},
    }


def probe_new_videos(client: Any, service: Any, opposite: dict[str, Any]) -> dict[str, Any]:
    """A video of each category uploaded now: each user's scores for the two."""
    cat_a, cat_b = opposite["users"]["categories"]
    now = int(time.time() * 1000)
    fresh = {cat: f"new-{cat}-{uuid.uuid4().hex[:6]}" for cat in (cat_a, cat_b)}
    videos = [{"video_id": vid, "creator_id": f"c-new-{cat}", "category": cat,
               "duration_ms": 40_000, "uploaded_at": now} for cat, vid in fresh.items()]
    assert client.put("/v1/videos", json={"videos": videos}, headers=KEY).status_code == 200
    out: dict[str, Any] = {}
    for name in ("likes_a", "likes_b"):
        user = opposite["users"][name]
        scores = scores_of(service, user, list(fresh.values()))
        out[name] = {cat: scores.get(vid) for cat, vid in fresh.items()}
    a_first = out["likes_a"][cat_a] > out["likes_a"][cat_b]
    b_first = out["likes_b"][cat_b] > out["likes_b"][cat_a]
    return {"scores": out, "loved_category_first": bool(a_first and b_first)}


def probe_new_video_tastes(client: Any, service: Any, demo: Any, users: int = 60) -> dict[str, Any]:
    """One new video per category, scored for the most active demo users (module doc)."""
    from app.schemas import RecommendRequest
    from feature_store.features.dense import history_counts

    world = demo.world
    now = int(time.time() * 1000)
    tag = uuid.uuid4().hex[:6]
    cats = list(range(world.config.categories))
    ids = [f"new-t{cat}-{tag}" for cat in cats]
    videos = [{"video_id": ids[cat], "creator_id": f"c-{ids[cat]}", "category": f"cat{cat}",
               "duration_ms": 40_000, "uploaded_at": now} for cat in cats]
    assert client.put("/v1/videos", json={"videos": videos}, headers=KEY).status_code == 200
    rows: list[dict[str, Any]] = []
    for user in np.argsort(-world.user_activity)[:users].tolist():
        uid = world.user_id(user)
        response = service.recommender.recommend(
            RecommendRequest(user_id=uid, candidates=ids, count=len(ids), explain=True)
        )
        engaged, rejected, _, _ = history_counts(service.resources.activity.history(uid))
        for item in response.items:
            cat = ids.index(item.video_id)
            assert item.explanation is not None
            why = item.explanation.rerank
            truth = 1 / (1 + np.exp(-(1.6 * (1.4 * world.user_taste[user, cat]
                                             + world.user_bias[user]) - 1.2)))
            rows.append({
                "user": user, "category": cat, "score": item.score,
                "model": item.explanation.model_score, "prior": why.prior, "lift": why.lift,
                "own_lift": getattr(why, "own_lift", None),
                "engaged": engaged[f"cat{cat}"], "rejected": rejected[f"cat{cat}"],
                "engaged_all": sum(engaged.values()), "rejected_all": sum(rejected.values()),
                "truth": float(truth),
                "favourite": cat in np.argsort(-world.user_taste[user])[:3].tolist(),
            })
    return {"users": users, "scored": taste_figures(rows, "score"),
            "prior_and_lift": taste_figures(rows, "prior_and_lift"), "rows": rows}


def taste_figures(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Favourite first, pair agreement and cross-entropy of ``key`` (module doc)."""
    def value(row: dict[str, Any]) -> float:
        if key != "prior_and_lift":
            return float(row[key])
        p, lift = row["prior"], row["lift"] or 0.0
        return float(1 / (1 + np.exp(-(np.log(p / (1 - p)) + lift))))

    by_user: dict[int, list[tuple[float, float, bool]]] = {}
    for row in rows:
        by_user.setdefault(row["user"], []).append((value(row), row["truth"], row["favourite"]))
    first, agree, pairs, entropy = 0, 0, 0, []
    for items in by_user.values():
        first += max(items)[2]
        for i, (s, t, _) in enumerate(items):
            q = min(max(s, 1e-6), 1 - 1e-6)
            entropy.append(-(t * np.log(q) + (1 - t) * np.log(1 - q)))
            for s2, t2, _ in items[i + 1:]:
                if s != s2 and t != t2:
                    pairs += 1
                    agree += (s > s2) == (t > t2)
    return {"favourite_first": round(first / max(1, len(by_user)), 4),
            "pair_agreement": round(agree / max(1, pairs), 4),
            "cross_entropy": round(float(np.mean(entropy)), 4)}


def sequence_tower(service: Any) -> dict[str, Any] | None:
    """The served sequence tower's refits and learnt weight (``trainer/sequence_weight.py``),
    from the trainer's status (None: no embedded trainer, or the tower is off)."""
    trainer = service.trainer
    status = trainer.status().get("sequence") if trainer is not None else None
    if not status:
        return None
    return {k: status.get(k) for k in ("views", "fits", "weight", "weight_fit", "failed_refits")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--sessions-per-s", type=float, default=None,
                        help="default: the demo's own rate")
    parser.add_argument("--backend", choices=["memory", "redis-kafka"], default="memory")
    parser.add_argument("--export-every-s", type=float, default=None,
                        help="default: what vidrec up --demo uses (app.demo.EXPORT_EVERY_S)")
    args = parser.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's nudge towards httpx2
        from fastapi.testclient import TestClient

    from app.demo import DemoTraffic, demo_settings
    from app.main import create_app
    from app.wiring import embedded_trainer

    extra, services = backend_settings(args.backend)
    if args.export_every_s is not None:
        extra["trainer"] = {"export_every_s": args.export_every_s}
    settings = demo_settings(
        Settings(data_dir=Path(tempfile.mkdtemp(prefix="vidrec-personal-")), **extra)
    )
    started = time.time()
    try:
        with TestClient(create_app(settings, trainer=embedded_trainer)) as client:
            service = client.app.state.service  # type: ignore[attr-defined]
            demo = DemoTraffic(service)
            demo.seed_catalog()
            rate = args.sessions_per_s or 1.0 / demo.interval_s
            windows = run_traffic(demo, args.minutes, rate)
            identical = probe_identical(service, demo)
            pools = probe_pools(service, demo)
            opposite = probe_opposite(client, service, demo)
            new_videos = probe_new_videos(client, service, opposite)
            tastes = probe_new_video_tastes(client, service, demo)
            sequence = sequence_tower(service)
    finally:
        for svc in services:
            svc.stop()
    results = {
        "backend": args.backend,
        "minutes": args.minutes,
        "sessions_per_s": rate,
        "windows": windows,
        "identical_scores": identical,
        "pools": pools,
        "opposite_tastes": opposite,
        "new_videos": new_videos,
        "new_video_tastes": tastes,
        "sequence_tower": sequence,
        "machine": f"{cpu_model(platform.machine())}, {os.cpu_count()} cores",
        "load_average_at_start": os.getloadavg()[0],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
    }
    print(json.dumps(results, indent=2))  # noqa: T201
    out = ROOT / "bench" / "results" / f"personal-{args.backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
