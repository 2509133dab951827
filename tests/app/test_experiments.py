"""An experiment end to end: two arms on two families, per-arm metrics, promote the winner.

The service runs embedded (memory backends); the second family's tables are
registered the way a retrain registers them (``test_families.family_tables``).
Users are split by the arms' hash, each arm's responses come from its own
family's version, events come back through ``POST /v1/events`` naming the
responses, and the dashboard's figures are compared with counts made here by
hand from the same events.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from feature_store.experiments import ExperimentSpec, arm_index, salt_bytes, thresholds
from tests.app.conftest import KEY, TestClient, make_settings, publish_model, service_of, wait_for
from tests.app.test_families import FAMILY, VIDEOS, family_tables

ADMIN = {**KEY, "X-Operator": "alice"}
EXPERIMENT = {
    "id": "exp1",
    "arms": [{"name": "a", "family": "main"}, {"name": "b", "family": FAMILY}],
}
Z = 1.959963984540054

pytestmark = pytest.mark.slow


def act(client: TestClient, action: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/dashboard/api/actions/{action}", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def wilson(k: int, n: int) -> tuple[float, float, float]:
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return p, centre - half, centre + half


def outcomes(i: int, rec: str, user: str, items: list[str]) -> list[dict[str, Any]]:
    """A fixed pattern of what user ``i`` did with the response ``rec``."""
    def event(n: int, kind: str, video: str, **fields: Any) -> dict[str, Any]:
        return {"event_id": f"{rec}-{n}", "user_id": user, "video_id": video, "type": kind,
                "ts": 1_763_700_000_000 + i * 1000 + n, "recommendation_id": rec, **fields}

    shown = items[:3]
    out = [event(k, "impression", video) for k, video in enumerate(shown)]
    if i % 2 == 0:
        out.append(event(10, "play", shown[0], watch_ms=(i % 5) * 10_000))
    if i % 3 == 0:
        out.append(event(11, "finish", shown[0], watch_ms=60_000))
    if i % 4 == 0:
        out.append(event(12, "click", shown[1]))
    out.append(event(13, "play", items[4], watch_ms=5_000))  # never shown: not counted
    out.append({**event(14, "finish", shown[2]), "user_id": "someone-else"})  # not this user's
    return out


def hand_count(events: list[dict[str, Any]]) -> dict[str, int]:
    """Per impression: clicked or played, finished, the largest watch (see tally.py)."""
    seen: dict[tuple[str, str, str], dict[str, int]] = {}
    for e in events:
        key = (e["recommendation_id"], e["video_id"], e["user_id"])
        state = seen.setdefault(key, {"shown": 0, "clicked": 0, "finished": 0, "watch": 0})
        kind = e["type"]
        state["shown"] |= kind == "impression"
        state["clicked"] |= kind in ("click", "play", "progress", "finish")
        state["finished"] |= kind == "finish"
        if kind in ("play", "progress", "finish"):
            state["watch"] = max(state["watch"], e.get("watch_ms", 0))
    shown = [s for s in seen.values() if s["shown"]]
    return {
        "impressions": len(shown),
        "clicks": sum(s["clicked"] for s in shown),
        "finishes": sum(s["finished"] for s in shown),
        "watch_ms": sum(s["watch"] for s in shown),
        "watch_sq": sum(s["watch"] ** 2 for s in shown),
    }


def test_two_arms_on_two_families_counted_and_the_winner_promoted(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", experiments={"checkpoint_every_s": 0.1})
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        resources = service.resources
        registry = resources.registry
        resources.catalog.upsert(VIDEOS)
        live = publish_model(registry, resources.schema, seed=3)
        wait_for(lambda: service.model is not None and service.model.version == live)
        with family_tables(service, "memory"):
            other = publish_model(registry, resources.schema, family=FAMILY, seed=4,
                                  activate=False)
            started = act(client, "experiment_start", experiment=EXPERIMENT)
            assert started["status"] == "done", started
            wait_for(lambda: service.arms.describe() and all(
                a["version"] for a in service.arms.describe()["arms"].values()))

            spec = ExperimentSpec.model_validate(EXPERIMENT)
            salt, bounds = salt_bytes(spec), thresholds(spec.arms)
            versions = {"a": live, "b": other}
            events: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
            candidates = [v.video_id for v in VIDEOS]
            for i in range(80):
                user = f"user{i}"
                body = {"user_id": user, "candidates": candidates, "count": 6}
                answer = client.post("/v1/recommend", json=body).json()
                arm = "ab"[arm_index(salt, user, bounds)]
                assert answer["experiment"] == {"id": "exp1", "arm": arm}
                assert answer["model_version"] == versions[arm]
                items = [item["video_id"] for item in answer["items"]]
                events[arm] += outcomes(i, answer["recommendation_id"], user, items)
            assert min(len(events["a"]), len(events["b"])) > 100  # both arms have users
            for arm in "ab":
                posted = client.post("/v1/events", json={"events": events[arm]}, headers=KEY)
                assert posted.json()["accepted"] == len(events[arm])

            def figures() -> list[dict[str, Any]] | None:
                view = client.get("/dashboard/api/experiments", headers=ADMIN).json()
                rows = view["running"]["arms"]
                expected = [hand_count(events[arm])["impressions"] for arm in "ab"]
                return rows if [r["impressions"] for r in rows] == expected else None

            rows = wait_for(figures, timeout_s=30)
            for row, arm in zip(rows, "ab", strict=True):
                counted = hand_count(events[arm])
                n = counted["impressions"]
                assert 0 < counted["finishes"] < counted["clicks"] < n
                assert (row["arm"], row["version"]) == (arm, versions[arm])
                assert (row["clicks"], row["finishes"]) == (counted["clicks"], counted["finishes"])
                assert row["watch_s"] == pytest.approx(counted["watch_ms"] / 1000)
                ctr = row["ctr"]
                assert (ctr["value"], ctr["low"], ctr["high"]) == pytest.approx(
                    wilson(counted["clicks"], n))
                finish = row["finish_rate"]
                assert (finish["value"], finish["low"], finish["high"]) == pytest.approx(
                    wilson(counted["finishes"], n))
                mean = counted["watch_ms"] / n / 1000
                sd = math.sqrt((counted["watch_sq"] - counted["watch_ms"] ** 2 / n) / (n - 1))
                watch = row["watch_s_per_impression"]
                assert watch["value"] == pytest.approx(mean)
                assert watch["high"] - mean == pytest.approx(Z * sd / 1000 / math.sqrt(n))
            assert rows[1]["vs_control"]["ctr"]["value"] == pytest.approx(
                rows[1]["ctr"]["value"] - rows[0]["ctr"]["value"])

            # Promote the winner: b's version becomes active for everyone, the experiment ends.
            concluded = act(client, "experiment_conclude", experiment="exp1", arm="b")
            assert concluded["status"] == "done", concluded
            assert concluded["result"]["version"] == other
            assert registry.active() == other
            wait_for(lambda: service.arms.current is None)
            answer = client.post("/v1/recommend", json={"user_id": "user1", "candidates":
                                                        candidates}).json()
            assert answer["experiment"] is None and answer["model_version"] == other
            book = client.get("/dashboard/api/experiments", headers=ADMIN).json()
            assert book["running"] is None
            assert (book["ended"][0]["status"], book["ended"][0]["winner"]) == ("concluded", "b")
            audit = client.get("/dashboard/api/audit", headers=ADMIN).json()["entries"]
            done = {(e["action"], e["actor"], e["status"]) for e in audit}
            assert {("experiment_start", "alice", "done"),
                    ("experiment_conclude", "alice", "done")} <= done


def test_start_is_refused_for_a_family_without_versions(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path / "data"))) as client:
        service = service_of(client)
        live = publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None and service.model.version == live)
        refused = act(client, "experiment_start", experiment=EXPERIMENT)
        assert refused["status"] == "failed"
        assert "no version of family" in refused["message"]
        assert service.experiments.running() is None
        bad = client.post("/dashboard/api/actions/experiment_start", headers=ADMIN,
                          json={"experiment": {"id": "x", "arms": [{"name": "a", "family": "f"}]}})
        assert bad.status_code == 422 and bad.json()["field"] == "experiment.arms"
