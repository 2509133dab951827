"""The dashboard with the trainer in another process: ``vidrec train`` beside the API.

Production's shape: Kafka (Tansu) as the event log, Redis for the sparse
tables, stores, metrics series, heartbeat and control channel, the registry
on a shared directory. The dashboard's actions reach the trainer over the
Redis control streams and come back acknowledged by it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

    import feature_store.eventlog.kafka  # noqa: F401  (kafka-python warns on import)

from app.main import create_app
from tests.app.conftest import service_of, wait_for
from tests.app.test_dashboard import ADMIN, act, dashboard_settings
from tests.services import TansuBroker

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture()
def shared_env(tmp_path: Path, redis_url: str, kafka_broker: TansuBroker) -> dict[str, str]:
    return {
        "VIDREC_DATA_DIR": str(tmp_path / "data"),
        "VIDREC_REDIS__URL": redis_url,
        "VIDREC_SPARSE__BACKEND": "redis",
        "VIDREC_STORES__BACKEND": "redis",
        "VIDREC_EVENT_LOG__BACKEND": "kafka",
        "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": f"dash{uuid.uuid4().hex[:8]}",
        "VIDREC_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
        "VIDREC_KAFKA__PARTITIONS": "2",
        "VIDREC_TRAINER__EXPORT_EVERY_S": "0",
        "VIDREC_TRAINER__MAX_WAIT_MS": "50",
        "VIDREC_TRAINER__METRICS_EVERY_S": "0.25",
    }


@pytest.fixture()
def trainer_process(shared_env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, **shared_env}
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "--log-level", "WARNING", "train"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def overview(client: TestClient) -> dict[str, Any]:
    out: dict[str, Any] = client.get("/dashboard/api/overview", headers=ADMIN).json()
    return out


def test_actions_reach_a_trainer_in_another_process(
    shared_env: dict[str, str], trainer_process: subprocess.Popen[bytes], monkeypatch: Any
) -> None:
    for name, value in shared_env.items():
        monkeypatch.setenv(name, value)
    settings = dashboard_settings(Path(shared_env["VIDREC_DATA_DIR"]))
    assert settings.stores.backend == "redis"
    with TestClient(create_app(settings)) as client:
        wait_for(lambda: overview(client)["training"].get("state") == "running", timeout_s=90,
                 interval_s=0.2)

        paused = act(client, "pause")
        assert paused["status"] == "done", paused
        wait_for(lambda: overview(client)["training"].get("state") == "paused", timeout_s=10)

        exported = act(client, "export")
        assert exported["status"] == "done", exported
        version = exported["result"]["version"]
        wait_for(lambda: service_of(client).model and service_of(client).model.version == version,
                 timeout_s=20)
        served = client.post("/v1/recommend", json={"user_id": "u1", "count": 3}).json()
        assert served["model_version"] == version

        resumed = act(client, "resume")
        assert resumed["status"] == "done"
        wait_for(lambda: overview(client)["training"].get("state") == "running", timeout_s=10)

        retrain = act(client, "retrain", from_ts_ms=0)
        assert retrain["status"] == "done", retrain
        family = retrain["result"]["family"]
        wait_for(
            lambda: [r["state"] for r in overview(client)["retrains"] if r["id"] == family]
            == ["running"],
            timeout_s=60,
        )
        stopped = act(client, "retrain_stop", target=family)
        assert stopped["status"] == "done"

        audit = client.get("/dashboard/api/audit", headers=ADMIN).json()["entries"]
        assert [e["action"] for e in audit[:5]] == [
            "retrain_stop", "retrain", "resume", "export", "pause"
        ]
    assert trainer_process.poll() is None, trainer_process.stderr
