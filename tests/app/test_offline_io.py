"""History in, vectors out: ``vidrec backfill`` and ``vidrec export-vectors`` beside the service.

The service runs as in production, on Kafka (Tansu) and Redis, under uvicorn
with the embedded trainer; the two commands run as separate ``vidrec``
processes on the same settings (environment variables), as an operator runs
them against a deployment.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import feature_store.eventlog.kafka  # noqa: F401

from app.main import create_app
from app.wiring import embedded_trainer
from feature_store.events import EventContext
from tests.app.conftest import KEY, make_settings, serve_in_thread, wait_for
from tests.services import RedisServer, TansuBroker

pq = pytest.importorskip("pyarrow.parquet")

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]

CATEGORIES = ("cars", "cats", "food")


@dataclass
class Deployment:
    url: str
    app: Any
    data_dir: Path
    env: dict[str, str]

    @property
    def service(self) -> Any:
        return self.app.state.service

    def vidrec(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``vidrec`` command on the deployment's settings (its own process)."""
        return subprocess.run([sys.executable, "-m", "app.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    kafka_broker: TansuBroker,
) -> Iterator[Deployment]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    data_dir = tmp_path_factory.mktemp("offline") / "data"
    namespace = f"off{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ, "VIDREC_DATA_DIR": str(data_dir),
        "VIDREC_REDIS__URL": redis_server.url, "VIDREC_SPARSE__BACKEND": "redis",
        "VIDREC_STORES__BACKEND": "redis", "VIDREC_EVENT_LOG__BACKEND": "kafka",
        "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": namespace,
        "VIDREC_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
        "VIDREC_KAFKA__PARTITIONS": "2",
    }
    settings = make_settings(
        data_dir, redis={"url": redis_server.url}, sparse={"backend": "redis"},
        stores={"backend": "redis"},
        event_log={"backend": "kafka", "topic_namespace": namespace},
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "partitions": 2},
        trainer={"export_every_s": 0, "max_wait_ms": 50, "batch_size": 256},
    )
    app = create_app(settings, trainer=embedded_trainer)
    with serve_in_thread(app) as url:
        yield Deployment(url, app, data_dir, env)


def videos_rows() -> list[dict[str, Any]]:
    return [{"video_id": f"{cat}{i}", "creator_id": f"{cat}-c{i % 3}", "category": cat,
             "tags": f"{cat}|x", "duration_ms": 60_000}
            for cat in CATEGORIES for i in range(10)]


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_backfill_goes_through_the_live_validation_and_dead_letters(
    deployment: Deployment, tmp_path: Path,
) -> None:
    day_ago = int(time.time() * 1000) - 86_400_000
    columns = ["event_id", "user_id", "video_id", "type", "ts", "watch_ms", "duration_ms",
               "device"]
    rows = [{"event_id": f"h{u}-{i}", "user_id": f"hist{u}", "video_id": f"{cat}{i}",
             "type": "finish", "ts": day_ago + 1000 * (u * 10 + i), "watch_ms": 60_000,
             "duration_ms": 60_000, "device": "phone"}
            for u, cat in enumerate(CATEGORIES) for i in range(10)]
    rows += [
        {**rows[0], "event_id": "late", "ts": int(time.time() * 1000) + 3_600_000},  # future
        {**rows[1], "event_id": "odd", "type": "teleport"},  # no such type
        {**rows[2], "event_id": "lost", "video_id": ""},  # no video
    ]
    events = write_csv(tmp_path / "history.csv", rows[::-1], columns)  # any order in the file
    videos = write_csv(tmp_path / "videos.csv", videos_rows(),
                       ["video_id", "creator_id", "category", "tags", "duration_ms"])
    trainer = deployment.service.trainer
    before = trainer.status()["events_total"]

    done = deployment.vidrec("backfill", str(events), "--videos", str(videos))
    assert done.returncode == 0, done.stderr
    assert "33 of 33 rows written to the event log" in done.stderr
    assert "will dead-letter 3 rows rejected" in done.stderr and "30 videos upserted" in done.stderr

    with httpx.Client(base_url=deployment.url, timeout=30) as http:
        assert http.get("/v1/videos/food3").json()["tags"] == ["food", "x"]
        wait_for(lambda: trainer.status()["events_total"] >= before + 30, timeout_s=90)
        group = trainer.status()["group_id"]

        def letters() -> list[Any]:
            found = deployment.service.resources.event_log.dead_letters(1000)
            return [d for d in found if d.group == group]

        refused = wait_for(lambda: len(found := letters()) >= 3 and found, timeout_s=60)
        reasons = sorted(d.reason.split(":")[0] for d in refused)
        assert reasons == ["ts", "type", "video_id"], [d.reason for d in refused]
        assert {json.loads(d.value)["event_id"] for d in refused} == {"late", "odd", "lost"}
        overview = http.get("/dashboard/api/overview", headers=KEY).json()
        assert overview["training"]["dead_letters"] >= 3
        # The history arrived as live events do: the users' histories, in event time order.
        history = http.get("/dashboard/api/users/hist2", headers=KEY).json()["history"]
        assert [h["video_id"] for h in history][:3] == ["food9", "food8", "food7"]
    assert trainer.status()["events_total"] == before + 30  # the bad ones never trained


def test_export_vectors_writes_what_the_service_computes(
    deployment: Deployment, tmp_path: Path,
) -> None:
    service = deployment.service
    now = int(time.time() * 1000)
    with httpx.Client(base_url=deployment.url, timeout=30) as http:
        put = http.put("/v1/videos", json={"videos": [
            {**v, "tags": v["tags"].split("|"), "uploaded_at": now - 3_600_000}
            for v in videos_rows()]}, headers=KEY)
        assert put.status_code == 200
        events = [{"event_id": f"x{u}-{i}", "user_id": f"vec{u}", "video_id": f"{cat}{i}",
                   "type": "finish", "watch_ms": 60_000, "duration_ms": 60_000,
                   "ts": now - 60_000 + 100 * i} for u, cat in enumerate(CATEGORIES)
                  for i in range(10)]
        assert http.post("/v1/events", json={"events": events}, headers=KEY).status_code == 200
        trainer = service.trainer
        wait_for(lambda: trainer.status()["metrics"] and trainer.status()["events_total"] >= 30,
                 timeout_s=90)
        version = trainer.export_now(activate=True)
        wait_for(lambda: service.model is not None and service.model.version == version,
                 timeout_s=60)
    users = tmp_path / "users.txt"
    users.write_text("vec0\nvec2\n\nnever-seen\nnot an id\n")

    done = deployment.vidrec("export-vectors", str(tmp_path / "out"), "--users", str(users))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["version"] == version and manifest["skipped_users"] == 1
    dim = manifest["towers"]["dim"]

    videos = pq.read_table(tmp_path / "out" / "videos.parquet").to_pydict()
    assert set(videos["video_id"]) >= {f"{c}{i}" for c in CATEGORIES for i in range(10)}
    matrix = np.array(videos["vector"], np.float32)
    assert matrix.shape == (len(videos["video_id"]), dim)
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-4)

    table = pq.read_table(tmp_path / "out" / "users.parquet").to_pydict()
    assert table["user_id"] == ["vec0", "vec2", "never-seen"]
    assert table["history_length"][0] >= 10 and table["history_length"][2] == 0
    width = len(manifest["towers"]["user_columns"]) * manifest["towers"]["table_dim"]
    assert np.array(table["pooled"]).shape == (3, width)
    # The exported user vector is the one the service searches with (same context).
    model = service.model.retrieval
    reads = service.scorer.row_reader(service.model)
    for row, user in enumerate(table["user_id"]):
        history = service.resources.activity.history(user)
        served = model.user_vector(user, manifest["exported_at_ms"], EventContext(), history,
                                   reads)
        assert np.allclose(table["vector"][row], served, atol=1e-5), user
