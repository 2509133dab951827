"""``vidrec serve --workers 2``: two processes on one port, sharing state through Redis and
Kafka as separate replicas do (``app/server.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from app.server import check_shared
from feature_store.errors import ConfigurationError
from feature_store.settings import Settings
from tests.production.stack import KEY, post, production_env, seed_catalog, vidrec, wait_until
from tests.services import TansuBroker, free_port, wait_for_port

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]


def children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


def recommended(client: httpx.Client, videos: list[str]) -> list[str]:
    body = {"user_id": "w1", "candidates": videos, "count": len(videos)}
    response = client.post("/v1/recommend", json=body, headers=KEY)
    assert response.status_code == 200, response.text
    return [item["video_id"] for item in response.json()["items"]]


def test_two_workers_share_one_port_and_their_state(
    tmp_path: Path, redis_url: str, kafka_broker: TansuBroker
) -> None:
    env = production_env(redis_url, kafka_broker.bootstrap,
                         VIDREC_DATA_DIR=str(tmp_path / "data"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = vidrec(["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
                   env, tmp_path / "serve.log")
    clients: dict[int, httpx.Client] = {}
    """One keep-alive connection per worker: a connection stays with the process that
    accepted it, and ``/readyz`` says which one that is."""

    def connect_both() -> bool:
        client = httpx.Client(base_url=url, timeout=30)
        ready = client.get("/readyz")
        pid = ready.json().get("process") if ready.status_code == 200 else None
        if pid is None or pid in clients:
            client.close()
            return False
        clients[pid] = client
        return len(clients) == 2

    try:
        wait_for_port(port, 120, serve)
        wait_until(connect_both, 120, "an answer from each of the two workers")
        assert set(clients) <= children(serve.pid)  # the workers, not the supervisor
        a, b = clients.values()

        # The catalog written through one worker is what the other one scores.
        videos = seed_catalog(url, 6)
        assert recommended(a, videos) and set(recommended(a, videos)) == set(videos)
        assert set(recommended(b, videos)) == set(videos)

        # An event accepted by one worker reaches the other's answers (the event log, the
        # signal feed, the shared history): a video the user watched is no longer offered.
        now = int(time.time() * 1000)
        post(a, [{"event_id": "w-1", "user_id": "w1", "video_id": videos[0], "type": "play",
                  "watch_ms": 50_000, "duration_ms": 60_000, "ts": now}])
        wait_until(lambda: videos[0] not in recommended(b, videos), 60,
                   "the watched video to leave the other worker's answers")
        assert videos[0] not in recommended(a, videos)
    finally:
        for client in clients.values():
            client.close()
        serve.terminate()
        assert serve.wait(60) == 0, (tmp_path / "serve.log").read_text()[-3000:]


def test_several_workers_are_refused_with_state_in_the_process() -> None:
    with pytest.raises(ConfigurationError, match="stores.backend, sparse.backend"):
        check_shared(Settings())
    check_shared(Settings(stores={"backend": "redis"}, sparse={"backend": "redis"},  # type: ignore[arg-type]
                          event_log={"backend": "kafka"}))
