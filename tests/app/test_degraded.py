"""Redis going away and coming back, with the Redis backends; the torch-free serving path."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.main import create_app
from tests.app.conftest import KEY, TestClient, make_settings, publish_model, service_of, wait_for
from tests.factories import make_event, make_video
from tests.services import RedisServer

pytestmark = pytest.mark.redis


def test_redis_down_degrades_then_recovers_by_itself(tmp_path: Path) -> None:
    server = RedisServer()
    server.start()
    try:
        settings = make_settings(
            tmp_path,
            redis={"url": server.url, "socket_timeout_s": 0.5},
            sparse={"backend": "redis"},
            stores={"backend": "redis"},
        )
        with TestClient(create_app(settings)) as client:
            service = service_of(client)
            now = int(time.time() * 1000)
            videos = [
                json.loads(
                    make_video(video_id=f"r{i}", uploaded_at=now - 1000 * i).model_dump_json()
                )
                for i in range(10)
            ]
            assert client.put("/v1/videos", json={"videos": videos}, headers=KEY).status_code == 200
            service.signals.record([make_event(video_id="r5", ts=now)])
            version = publish_model(service.resources.registry, service.resources.schema)
            wait_for(lambda: client.get("/readyz").json()["degraded"] is False)
            wait_for(lambda: len(service.popular.items) == 10)
            normal = client.post("/v1/recommend", json={"user_id": "u1", "count": 3}).json()
            assert normal["degraded"] is False and normal["model_version"] == version

            server.stop()
            down = client.post("/v1/recommend", json={"user_id": "u1", "count": 3})
            assert down.status_code == 200
            body = down.json()
            assert body["degraded"] is True and body["fallback_reason"] == "degraded"
            assert len(body["items"]) == 3 and body["model_version"] == version
            ready = client.get("/readyz")  # still answering: stays in rotation, says why
            assert ready.status_code == 200 and ready.json()["degraded"] is True
            assert ready.json()["checks"]["redis"].startswith("down")
            given = client.post("/v1/recommend", json={"user_id": "u1", "candidates": ["r1", "r2"]})
            assert given.status_code == 200 and [i["video_id"] for i in given.json()["items"]] == [
                "r1",
                "r2",
            ]
            # Writes say the backend is unavailable instead of failing with a 500.
            put = client.put("/v1/videos", json={"videos": videos[:1]}, headers=KEY)
            assert put.status_code == 503 and put.json()["error"] == "StoreUnavailable"
            assert 'vidrec_fallbacks_total{reason="degraded"}' in client.get("/metrics").text

            assert 'vidrec_dependency_up{dependency="redis"} 0.0' in client.get("/metrics").text
            server.start()  # same port, empty: it comes back without a restart of the service
            wait_for(lambda: client.get("/readyz").json()["degraded"] is False, timeout_s=15)
            back = client.post("/v1/recommend", json={"user_id": "u1"}).json()
            assert back["degraded"] is False
    finally:
        server.stop()


def test_serving_path_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from feature_store.settings import Settings\n"
        "from app.main import create_app\n"
        "import app.server, app.demo, app.signal_feed\n"
        "import asyncio\n"
        f"app_ = create_app(Settings(data_dir={str(tmp_path)!r}))\n"
        "async def main():\n"
        "    async with app_.router.lifespan_context(app_):\n"
        "        assert app_.state.service is not None\n"
        "asyncio.run(main())\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'trainer' not in sys.modules, 'trainer imported'\n"
        "print('clean')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "clean" in result.stdout
