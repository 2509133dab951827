"""What an operator of ``vidrec up`` sees, over HTTP on a real socket.

The app is built as ``vidrec up --demo`` builds it (the composition root's
embedded trainer and demo traffic) and served by uvicorn on a free port;
every check goes through the routes an operator or a client uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from app.wiring import embedded_extensions, embedded_trainer
from feature_store.models.registry import family_of
from tests.app.conftest import serve_in_thread, wait_for
from tests.app.test_dashboard import dashboard_settings

pytestmark = pytest.mark.slow

ADMIN = {"X-API-Key": "vidrec-dev-key", "X-Operator": "ops"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """``vidrec up --demo`` on a real socket, shared by this module's tests."""
    settings = dashboard_settings(tmp_path_factory.mktemp("up") / "data")
    app = create_app(
        settings, trainer=embedded_trainer, extensions=embedded_extensions(demo=True)
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def samples(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` as {name{labels}: value}."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_metrics_carry_the_embedded_trainers_series(up: httpx.Client) -> None:
    # A request observed before the scrape: a scrape's own latency is recorded only after
    # its answer, so a first scrape that already finds the trainer's series shows none.
    assert up.get("/healthz").status_code == 200
    figures = wait_for(
        lambda: (s := samples(up)).get("vidrec_trainer_events_total", 0) > 0
        and "vidrec_trainer_auc" in s and s,
        timeout_s=120, interval_s=0.3,
    )
    for name in ("vidrec_trainer_consumer_lag", "vidrec_trainer_events_per_second",
                 "vidrec_trainer_samples_total", "vidrec_trainer_batch_seconds_count",
                 "vidrec_trainer_baseline_auc", "vidrec_trainer_logloss"):
        assert name in figures, name
    assert 0.0 <= figures["vidrec_trainer_auc"] <= 1.0
    assert figures["vidrec_trainer_batch_seconds_count"] > 0
    # The service's own series are still there, once each.
    assert "vidrec_events_total{result=accepted}" in figures or any(
        k.startswith("vidrec_request_seconds") for k in figures
    )
    body = up.get("/metrics").text
    assert body.count("# TYPE vidrec_trainer_auc gauge") == 1


def act(http: httpx.Client, action: str, **body: Any) -> dict[str, Any]:
    """A dashboard action with the admin key; its audited outcome."""
    response = http.post(f"/dashboard/api/actions/{action}", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def recommend(http: httpx.Client, user: str = "someone") -> dict[str, Any]:
    out: dict[str, Any] = http.post("/v1/recommend", json={"user_id": user, "count": 5}).json()
    return out


def test_export_answers_done_once_the_new_version_is_served(up: httpx.Client) -> None:
    for _ in range(3):  # each time: export, then at once recommend
        exported = act(up, "export")
        assert exported["status"] == "done", exported
        version = exported["result"]["version"]
        assert exported["result"]["served"] == version and "served" in exported["message"]
        assert recommend(up)["model_version"] == version

    kept = act(up, "export", activate=False)
    assert kept["status"] == "done" and kept["result"]["activated"] is False
    assert kept["result"]["served"] == version  # says what is served, and does not wait
    assert f"serving {version}" in kept["message"] and "not activated" in kept["message"]
    assert recommend(up)["model_version"] == version


def test_rollback_after_an_experiments_retrain_arm_won_serves_main_again(
    tmp_path: Path,
) -> None:
    """A retrain family wins an experiment and its trainer's exports follow; Roll back
    undoes the promotion: main is served again, and the retrain's exports stay out."""
    settings = dashboard_settings(tmp_path / "data", trainer={"export_every_s": 1.0})
    app = create_app(
        settings, trainer=embedded_trainer, extensions=embedded_extensions(demo=True)
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as http:

        def models() -> dict[str, Any]:
            out: dict[str, Any] = http.get("/dashboard/api/overview", headers=ADMIN).json()
            return dict(out["models"])

        def active_of(family: str) -> str | None:
            active = models()["active"]
            return active if active and family_of(active) == family else None

        wait_for(lambda: active_of("main") and recommend(http)["model_version"] == active_of(
            "main"), timeout_s=120, interval_s=0.3)
        started = act(http, "retrain", from_ts_ms=int(time.time() * 1000) - 600_000)
        assert started["status"] == "done", started
        family = started["result"]["family"]
        wait_for(lambda: any(v["family"] == family for v in models()["versions"]),
                 timeout_s=120, interval_s=0.3)
        assert family_of(models()["active"]) == "main"  # its exports wait for a decision

        experiment = {"id": "retrain-vs-main",
                      "arms": [{"name": "main", "family": "main"},
                               {"name": "retrain", "family": family}]}
        assert act(http, "experiment_start", experiment=experiment)["status"] == "done"
        won = act(http, "experiment_conclude", experiment="retrain-vs-main", arm="retrain")
        assert won["status"] == "done", won
        winner = won["result"]["version"]
        # The winning family is the active one: its trainer's next exports take over.
        wait_for(lambda: (a := active_of(family)) and a != winner, timeout_s=60, interval_s=0.2)
        assert models()["rollback_target"] == won["result"]["previous"]

        back = act(http, "rollback")
        assert back["status"] == "done", back["message"]
        assert family_of(back["result"]["previous"]) == family  # newer, or newer still
        main_version = back["result"]["version"]
        assert family_of(main_version) == "main"
        # Served: that version, or main's trainer's next export (every second here).
        assert family_of(back["result"]["served"]) == "main"
        assert family_of(recommend(http)["model_version"]) == "main"
        rolled_back_ms = int(time.time() * 1000)

        # The retrain goes on exporting, and none of its exports is activated; main's are.
        def exported_since(family_name: str) -> list[str]:
            return [v["version"] for v in models()["versions"]
                    if v["family"] == family_name and v["created_at_ms"] > rolled_back_ms]

        wait_for(lambda: len(exported_since(family)) >= 2, timeout_s=60, interval_s=0.2)
        wait_for(lambda: (a := active_of("main")) and a != main_version, timeout_s=60,
                 interval_s=0.2)
        served = wait_for(lambda: (r := recommend(http))["model_version"] == active_of(
            "main") and r, timeout_s=30)
        assert family_of(served["model_version"]) == "main"
        assert act(http, "retrain_stop", target=family)["status"] == "done"


def test_the_dashboard_shows_the_demo_users_figures(up: httpx.Client) -> None:
    """The demo's tiles come from the demo the app's lifespan opened (not a field set on
    the service from outside): sessions counted, shares in [0, 1] once videos were shown."""

    def demo() -> dict[str, Any] | None:
        figures: dict[str, Any] | None = up.get(
            "/dashboard/api/overview", headers=ADMIN
        ).json()["serving"]["demo"]
        return figures if figures and figures["sessions"] > 0 else None

    figures = wait_for(demo, timeout_s=120, interval_s=0.5)
    for share in ("play_rate", "favourite_share", "popular_favourite_share"):
        assert figures[share] is None or 0.0 <= figures[share] <= 1.0, figures
