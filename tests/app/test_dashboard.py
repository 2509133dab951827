"""The dashboard's JSON API: keys, figures, audited actions, over the real embedded trainer.

The browser tests (``tests/app/browser``) drive the same routes through the
page; these pin the contract below it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from app.candidates.sources import SOURCE_NAMES
from app.dashboard.audit import FileAuditLog, RedisAuditLog, recent
from app.dashboard.sampling import quantile
from app.main import create_app
from app.wiring import embedded_extensions, embedded_trainer
from feature_store.settings import Settings
from tests.app.conftest import make_settings, publish_model, service_of, wait_for

ADMIN = {"X-API-Key": "vidrec-dev-key", "X-Operator": "alice"}
VIEWER_KEY = "viewer-key-for-tests"
VIEWER = {"X-API-Key": VIEWER_KEY}

pytestmark = pytest.mark.slow


def dashboard_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Embedded settings with a small, quick trainer and fast sampling."""
    trainer = {
        "batch_size": 64, "max_wait_ms": 50, "export_every_s": 0, "metrics_every_s": 0.25,
        "checkpoint_every_s": 2, "metrics_window": 2000,
    }
    trainer.update(overrides.pop("trainer", {}))
    dashboard = {
        "viewer_key": VIEWER_KEY, "sample_every_s": 0.2, "rate_window_s": 2,
        "table_stats_every_s": 0.5, "ack_timeout_s": 30,
    }
    dashboard.update(overrides.pop("dashboard", {}))
    return make_settings(data_dir, trainer=trainer, dashboard=dashboard, **overrides)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The embedded service, trainer and demo traffic, shared by this module's tests."""
    settings = dashboard_settings(tmp_path_factory.mktemp("dash") / "data")
    with TestClient(create_app(
        settings, trainer=embedded_trainer, extensions=embedded_extensions(demo=True)
    )) as client:
        yield client


def act(client: TestClient, action: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/dashboard/api/actions/{action}", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def test_keys_wrong_missing_viewer_and_admin(live: TestClient) -> None:
    assert live.get("/dashboard").status_code == 200  # the page itself holds no data
    assert "text/html" in live.get("/dashboard").headers["content-type"]
    assert live.get("/dashboard/static/dashboard.js").status_code == 200
    assert live.get("/dashboard/static/../main.py").status_code == 404
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
        response = live.get("/dashboard/api/overview", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"] == "Unauthorized"
    assert live.get("/dashboard/api/session", headers=VIEWER).json()["role"] == "viewer"
    assert live.get("/dashboard/api/overview", headers=VIEWER).status_code == 200
    refused = live.post("/dashboard/api/actions/pause", json={}, headers=VIEWER)
    assert refused.status_code == 403
    bearer = {"Authorization": "Bearer vidrec-dev-key"}
    assert live.get("/dashboard/api/session", headers=bearer).json()["role"] == "admin"


def test_overview_fills_under_traffic(live: TestClient) -> None:
    def filled() -> dict[str, Any] | None:
        o = live.get("/dashboard/api/overview", headers=ADMIN).json()
        training, serving = o["training"], o["serving"]
        points = [p for p in training["points"] if p["auc"] is not None]
        busy = [p for p in serving["points"] if (p["requests_per_s"] or 0) > 0]
        rows = any(t["rows"] > 0 for t in o["tables"]["tables"].values())
        ok = points and busy and rows and training["state"] == "running"
        return o if ok else None

    o = wait_for(filled, timeout_s=60, interval_s=0.3)
    training = o["training"]
    assert set(training["lag_per_partition"]) == {"0", "1", "2", "3"}
    assert training["dead_letters"] == 0
    assert training["latest"]["events_total"] > 0
    assert {"auc", "baseline_auc", "logloss", "baseline_logloss"} <= set(training["points"][-1])
    heads = {"negative_auc", "negative_baseline_auc", "watch_spearman", "watch_mae"}
    assert heads <= set(training["points"][-1]) and heads <= set(training["latest"])
    join = training["served_join"]  # the trainer's served-log join, by outcome
    assert {"joined", "missing", "late", "unknown", "other_schema"} <= set(join)
    factors = training["sequence"]["factorization"]  # the live factorisation's figures
    assert set(factors) == {"fits", "fitted_pairs", "users_folded", "last_fit_seconds", "failed"}
    serving = o["serving"]
    assert serving["provider"] is None or serving["provider"].endswith("ExecutionProvider")
    assert [s["stage"] for s in serving["stages"]] == [
        "candidates", "features", "pull", "onnx", "total"
    ]
    assert {"user", "video", "wide"} <= set(o["tables"]["tables"])
    later = live.get(
        "/dashboard/api/overview", params={"since_ms": training["points"][-1]["ts_ms"]},
        headers=ADMIN,
    ).json()
    assert all(p["ts_ms"] > training["points"][-1]["ts_ms"] for p in later["training"]["points"])


def test_export_rollback_promote_are_served_and_audited(live: TestClient) -> None:
    first = act(live, "export")
    assert first["status"] == "done", first
    v1 = first["result"]["version"]
    wait_for(lambda: service_of(live).model and service_of(live).model.version == v1)
    second = act(live, "export")
    v2 = second["result"]["version"]
    models = live.get("/dashboard/api/overview", headers=ADMIN).json()["models"]
    assert models["versions"][0]["version"] == v2
    wait_for(lambda: service_of(live).model.version == v2)

    back = act(live, "rollback")
    assert back["status"] == "done" and back["result"]["version"] == v1
    rec = live.post("/v1/recommend", json={"user_id": "u3", "count": 5}).json()
    assert rec["model_version"] == v1  # the service answers with the previous version
    models = live.get("/dashboard/api/overview", headers=ADMIN).json()["models"]
    active = [v for v in models["versions"] if v["active"]]
    assert [v["version"] for v in active] == [v1] and active[0]["served"]

    again = act(live, "promote", version=v2)
    assert again["status"] == "done" and service_of(live).model.version == v2
    missing = live.post(
        "/dashboard/api/actions/promote", json={"version": "main-nope"}, headers=ADMIN
    ).json()
    assert missing["status"] == "failed" and "does not exist" in missing["message"]

    audit = live.get("/dashboard/api/audit", headers=VIEWER).json()["entries"]
    by_action = [(e["action"], e["status"], e["actor"]) for e in audit[:5]]
    assert by_action == [
        ("promote", "failed", "alice"), ("promote", "done", "alice"),
        ("rollback", "done", "alice"), ("export", "done", "alice"), ("export", "done", "alice"),
    ]
    assert all(e["role"] == "admin" and e["ended_ms"] >= e["ts_ms"] for e in audit[:5])


def test_pause_and_resume_change_the_trainer_state(live: TestClient) -> None:
    paused = act(live, "pause")
    assert paused["status"] == "done" and paused["result"] == {"state": "paused"}
    state = live.get("/dashboard/api/overview", headers=ADMIN).json()["training"]["state"]
    assert state == "paused"
    trained = live.get("/dashboard/api/overview", headers=ADMIN).json()["training"]
    resumed = act(live, "resume")
    assert resumed["result"] == {"state": "running"}
    wait_for(
        lambda: live.get("/dashboard/api/overview", headers=ADMIN).json()["training"]["latest"][
            "events_total"
        ] > trained["latest"]["events_total"],
        timeout_s=30,
    )


def test_user_insight_shows_history_and_sources(live: TestClient) -> None:
    def someone() -> dict[str, Any] | None:
        for n in range(50):
            u = live.get(f"/dashboard/api/users/u{n}", headers=ADMIN).json()
            if u["history"]:
                return u
        return None

    user = wait_for(someone, timeout_s=30, interval_s=0.5)
    assert {"video_id", "watch_ratio", "category"} <= set(user["history"][0])
    assert user["recommendations"]
    assert {r["source"] for r in user["recommendations"]} <= set(SOURCE_NAMES)
    watched = {h["video_id"] for h in user["history"]}
    assert not watched & {r["video_id"] for r in user["recommendations"]}


def test_retrain_trains_a_new_family_beside_the_live_one(live: TestClient) -> None:
    import time

    service = service_of(live)
    assert act(live, "export")["status"] == "done"  # a live version to roll back to
    live_active = service.resources.registry.active()
    wait_for(lambda: service.model is not None and service.model.version == live_active)
    out = act(live, "retrain", from_ts_ms=int(time.time() * 1000) - 600_000)
    assert out["status"] == "done", out
    family = out["result"]["family"]
    again = act(live, "retrain", from_ts_ms=0)
    assert again["status"] == "failed" and "still running" in again["message"]

    def progressed() -> dict[str, Any] | None:
        o = live.get("/dashboard/api/overview", headers=ADMIN).json()
        rows = [r for r in o["retrains"] if r["id"] == family]
        ok = rows and rows[0]["state"] == "running" and (rows[0]["latest"].get("events_total") or 0)
        return rows[0] if ok and rows[0]["points"] else None

    row = wait_for(progressed, timeout_s=60, interval_s=0.3)
    assert row["group_id"].endswith(family) and row["from_ts_ms"] == out["args"]["from_ts_ms"]

    exported = act(live, "export", target=family)
    assert exported["status"] == "done" and "not activated" in exported["message"]
    version = exported["result"]["version"]
    assert version.startswith(family) and service.resources.registry.active() == live_active
    manifest = service.resources.registry.manifest(version)
    assert manifest.family == family and manifest.training_position["events_total"] > 0

    promoted = act(live, "promote", version=version)
    assert promoted["status"] == "done", promoted
    assert service.resources.registry.active() == version
    assert service.model.manifest.family == family
    manager = service.retrain
    tables = manager.families[family].resources.tables
    assert service.resources.families.tables(family) is tables
    body = {"user_id": "someone", "candidates": ["v1", "v2"]}
    assert live.post("/v1/recommend", json=body).json()["model_version"] == version

    back = act(live, "rollback")
    assert back["status"] == "done" and back["result"]["version"] == live_active
    assert service.model.version == live_active
    assert live.post("/v1/recommend", json=body).json()["model_version"] == live_active

    live_tables = service.resources.tables
    assert manager.families[family].resources.tables["user"] is not live_tables["user"]
    family_activity = manager.families[family].resources.training_activity
    assert family_activity is not service.resources.training_activity
    # Its own live factorisation: the family's fits never replace the ones the service reads.
    assert manager.families[family].resources.factors is not service.resources.factors

    stopped = act(live, "retrain_stop", target=family)
    assert stopped["status"] == "done"
    o = live.get("/dashboard/api/overview", headers=ADMIN).json()
    assert [r["state"] for r in o["retrains"] if r["id"] == family] == ["stopped"]


def test_trainer_actions_time_out_without_a_trainer(tmp_path: Path) -> None:
    settings = dashboard_settings(tmp_path / "data", dashboard={"ack_timeout_s": 0.3})
    with TestClient(create_app(settings)) as client:
        out = act(client, "export")
        assert out["status"] == "timeout" and "no trainer" in out["message"]
        assert client.get("/dashboard/api/overview", headers=ADMIN).json()["training"][
            "state"
        ] == "unreachable"
        conflict = act(client, "rollback")
        assert conflict["status"] == "failed" and "no previous version" in conflict["message"]
    lines = (tmp_path / "data" / "dashboard" / "audit.jsonl").read_text().splitlines()
    statuses = [json.loads(line)["status"] for line in lines]
    assert statuses == ["requested", "timeout", "requested", "failed"]


def test_promote_of_a_family_without_tables_is_put_back(tmp_path: Path) -> None:
    settings = dashboard_settings(tmp_path / "data")
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        registry, schema = service.resources.registry, service.resources.schema
        live_version = publish_model(registry, schema)
        wait_for(lambda: service.model and service.model.version == live_version)
        other = publish_model(registry, schema, family="r1", activate=False)
        out = act(client, "promote", version=other)
        assert out["status"] == "failed" and "refused" in out["message"]
        assert "no sparse tables of family 'r1'" in out["message"]
        assert registry.active() == live_version and service.model.version == live_version


def test_audit_log_folds_requests_and_outcomes(tmp_path: Path) -> None:
    log = FileAuditLog(tmp_path / "audit.jsonl")
    log.append({"id": "a", "ts_ms": 1, "action": "export", "status": "requested"})
    log.append({"id": "b", "ts_ms": 2, "action": "pause", "status": "requested"})
    log.append({"id": "a", "ts_ms": 3, "action": "export", "status": "done", "message": "v1"})
    with open(tmp_path / "audit.jsonl", "a") as fh:
        fh.write('{"id": "torn", "ts')  # a crash mid-append
    rows = recent(FileAuditLog(tmp_path / "audit.jsonl"), 10)
    assert [(r["id"], r["status"]) for r in rows] == [("b", "requested"), ("a", "done")]
    assert rows[1]["ts_ms"] == 1 and rows[1]["ended_ms"] == 3


@pytest.mark.redis
def test_redis_audit_log_is_shared(redis_url: str) -> None:
    import redis

    one, two = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    try:
        RedisAuditLog(one).append({"id": "x", "ts_ms": 1, "status": "requested"})
        RedisAuditLog(one).append({"id": "x", "ts_ms": 2, "status": "done"})
        assert [r["status"] for r in recent(RedisAuditLog(two), 5)] == ["done"]
    finally:
        one.close()
        two.close()


def test_quantile_interpolates_within_buckets() -> None:
    inf = float("inf")
    deltas = [(0.001, 0.0), (0.002, 50.0), (0.005, 100.0), (inf, 100.0)]
    assert quantile(deltas, 0.5) == pytest.approx(0.002)
    assert quantile(deltas, 0.75) == pytest.approx(0.0035)
    assert quantile([(0.001, 0.0), (inf, 0.0)], 0.5) is None
    assert quantile([(0.001, 0.0), (inf, 10.0)], 0.99) == 0.001  # beyond the last bound
