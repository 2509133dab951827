"""The served log end to end (embedded): logged per response, joined by the trainer, never in
the way of a recommend."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.main import create_app
from app.wiring import embedded_trainer
from feature_store.errors import EventLogUnavailable
from tests.app.conftest import KEY, make_settings, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette nudges towards httpx2
    from fastapi.testclient import TestClient


def _catalog(now: int, n: int = 30) -> list[dict[str, Any]]:
    return [
        {"video_id": f"s{i}", "creator_id": f"c{i % 4}", "category": f"k{i % 3}",
         "tags": ["t"], "duration_ms": 60_000, "uploaded_at": now - 3_600_000}
        for i in range(n)
    ]


def _metric(client: TestClient, outcome: str) -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(f'vidrec_served_log_records_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_impressions_with_a_recommendation_id_train_on_what_was_served(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path / "data", trainer={"export_every_s": 0, "max_wait_ms": 20, "join_window_ms": 500}
    )
    app = create_app(settings, trainer=embedded_trainer)
    with TestClient(app) as client:
        now = int(time.time() * 1000)
        client.put("/v1/videos", json={"videos": _catalog(now)}, headers=KEY)
        service = app.state.service
        trainer = service.trainer
        trainer.export_now(activate=True)
        wait_for(lambda: service.holder.current is not None, timeout_s=30)
        ask = {"user_id": "ann", "candidates": [f"s{i}" for i in range(30)], "count": 10}
        response = client.post("/v1/recommend", json=ask).json()
        assert response["model_version"] is not None
        wait_for(lambda: _metric(client, "written") >= 1)
        rec = response["recommendation_id"]
        ts = int(time.time() * 1000)
        events = [
            {"event_id": f"imp{k}", "user_id": "ann", "video_id": item["video_id"],
             "type": "impression", "ts": ts + k, "recommendation_id": rec}
            for k, item in enumerate(response["items"])
        ]
        events.append({"event_id": "fin0", "user_id": "ann",
                       "video_id": response["items"][0]["video_id"], "type": "finish",
                       "ts": ts + 50, "watch_ms": 60_000, "recommendation_id": rec})
        assert client.post("/v1/events", json={"events": events}, headers=KEY).json()[
            "accepted"] == 11
        status = wait_for(
            lambda: (s := trainer.status())["served"]["joined"] >= 10 and s, timeout_s=30
        )
        assert status["served"]["missing"] == 0
        # The finish and, once the join window passed, the nine timeouts trained on them.
        wait_for(lambda: trainer.status()["samples_total"] >= 10, timeout_s=30)


@contextmanager
def _serving(tmp_path: Path, **overrides: Any) -> Iterator[tuple[TestClient, Any]]:
    """An embedded app (``make_settings`` with ``overrides``) with the 30-video catalog and
    an exported model being served: its client and its service."""
    app = create_app(make_settings(tmp_path / "data", **overrides), trainer=embedded_trainer)
    with TestClient(app) as client:
        client.put("/v1/videos", json={"videos": _catalog(int(time.time() * 1000))},
                   headers=KEY)
        service = app.state.service
        service.trainer.export_now(activate=True)
        wait_for(lambda: service.holder.current is not None, timeout_s=30)
        yield client, service


def test_recommend_answers_when_the_served_log_is_down(tmp_path: Path) -> None:
    with _serving(tmp_path) as (client, service):

        def down(records: object) -> None:
            raise EventLogUnavailable("served log down")

        service.resources.served_log.produce = down
        ask = {"user_id": "bo", "candidates": [f"s{i}" for i in range(30)], "count": 5}
        for _ in range(3):
            response = client.post("/v1/recommend", json=ask)
            assert response.status_code == 200 and response.json()["fallback"] is False
        wait_for(lambda: _metric(client, "failed") >= 3)


def test_a_full_queue_drops_records_instead_of_waiting(tmp_path: Path) -> None:
    with _serving(tmp_path, served_log={"queue_records": 1}) as (client, service):
        stuck = threading.Event()
        release = threading.Event()

        def slow(records: object) -> None:
            stuck.set()
            release.wait(10)

        service.resources.served_log.produce = slow
        ask = {"user_id": "cy", "candidates": [f"s{i}" for i in range(30)], "count": 5}
        client.post("/v1/recommend", json=ask)
        stuck.wait(5)
        for _ in range(4):  # one waits in the queue, the others find it full
            assert client.post("/v1/recommend", json=ask).status_code == 200
        assert _metric(client, "dropped") >= 3
        release.set()


def test_a_record_that_cannot_be_packed_is_counted_and_the_answer_stands(
    tmp_path: Path,
) -> None:
    """Packing happens on the request's thread (app/served_log.py): a bug there must cost
    the record, not the response."""
    with _serving(tmp_path) as (client, service):
        writer = service.recommender.served_log

        def broken(served: object) -> None:
            raise ValueError("a packing bug")

        writer.to_record = broken
        ask = {"user_id": "di", "candidates": [f"s{i}" for i in range(30)], "count": 5}
        for _ in range(2):
            response = client.post("/v1/recommend", json=ask)
            assert response.status_code == 200 and response.json()["fallback"] is False
        assert _metric(client, "failed") >= 2
