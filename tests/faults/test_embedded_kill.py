"""``vidrec up`` (everything in one process) killed with SIGKILL right after writes.

Every catalog write and hide answered 200 must be there after the restart
(they are journalled and fsynced before the answer; the snapshot used to
be written only on a clean shutdown, so a hidden video came back), and so
must what the docs promise of the signals: trending counts of the events
accepted before the kill (the signal feed replays what its last snapshot
lacks).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import KEY, start_embedded, stop, wait_until
from tests.services import free_port

pytestmark = [pytest.mark.faults, pytest.mark.slow]

OLD_MS = 30 * 24 * 3600 * 1000
"""Uploaded a month ago: outside the fresh-uploads window, so only trending proposes them."""


def _up(data_dir: Path, port: int, log: Path) -> tuple[object, httpx.Client]:
    process = start_embedded(data_dir, port, log)
    return process, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)


def _trending(http: httpx.Client) -> list[str]:
    """What the trending source proposes to a user with no history."""
    body = http.post("/v1/recommend", json={"user_id": "new-user", "count": 10}).json()
    return [i["video_id"] for i in body["items"] if i["source"] == "trending"]


def test_kill_9_keeps_every_acknowledged_catalog_write_hide_and_trending(tmp_path: Path) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "up.log"
    now = int(time.time() * 1000)
    videos = [
        {"video_id": f"k{i}", "creator_id": f"kc{i}", "category": "news", "tags": [],
         "duration_ms": 60_000, "uploaded_at": now - OLD_MS - i}
        for i in range(6)
    ]
    process, http = _up(data_dir, free_port(), log)
    try:
        assert http.put("/v1/videos", json={"videos": videos[:4]}, headers=KEY).status_code == 200
        assert http.put("/v1/videos", json={"videos": videos[4:]}, headers=KEY).status_code == 200
        assert http.post("/v1/videos/k1/hide", headers=KEY).status_code == 200
        events = [
            {"event_id": f"kev{i}", "user_id": f"ku{i}", "video_id": "k3", "type": "finish",
             "watch_ms": 60_000, "ts": now}
            for i in range(5)
        ]
        assert http.post("/v1/events", json={"events": events}, headers=KEY).status_code == 200
        wait_until(lambda: "k3" in _trending(http), 30, "the signal feed to record the events")
        process.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
        process.wait(10)  # type: ignore[attr-defined]
    finally:
        http.close()
        stop(process)  # type: ignore[arg-type]

    process, http = _up(data_dir, free_port(), log)
    try:
        for video in videos:
            got = http.get(f"/v1/videos/{video['video_id']}", headers=KEY)
            assert got.status_code == 200, (video["video_id"], got.text, log.read_text()[-2000:])
        assert http.get("/v1/videos/k1", headers=KEY).json()["hidden"] is True
        asked = http.post("/v1/recommend", json={
            "user_id": "someone", "candidates": [v["video_id"] for v in videos], "count": 10,
        }).json()
        assert "k1" not in [i["video_id"] for i in asked["items"]]

        wait_until(lambda: "k3" in _trending(http), 30, "the replayed events to trend k3")
        assert "k1" not in _trending(http)
    finally:
        http.close()
        stop(process)  # type: ignore[arg-type]
