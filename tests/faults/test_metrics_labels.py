"""``/metrics`` does not grow with the paths clients send.

Any unknown path, with no key, used to add a ``route`` label series. Now the
label is the template of the route that answered, or ``unmatched``.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from app.main import create_app
from tests.app.conftest import KEY, TestClient, make_settings

pytestmark = [pytest.mark.faults]


def _series(client: TestClient) -> set[str]:
    text = client.get("/metrics").text
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


def test_series_count_unchanged_after_1000_random_paths(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path / "data"))) as client:
        _random_paths(client)


def _random_paths(client: TestClient) -> None:
    client.get("/no/such/path")
    client.get("/v1/videos/some-video", headers=KEY)  # a templated route: one label, any id
    _series(client)  # /metrics itself is a route too
    before = _series(client)
    for _ in range(1000):
        path = f"/{uuid.uuid4().hex}/{uuid.uuid4().hex}"
        assert client.get(path).status_code == 404
        client.get(f"/v1/videos/{uuid.uuid4().hex}", headers=KEY)
    after = _series(client)
    assert after == before
    routes = {s.split('route="', 1)[1].split('"', 1)[0] for s in after if 'route="' in s}
    assert "unmatched" in routes and "/v1/videos/{video_id}" in routes
    assert all(r == "unmatched" or r.startswith("/") for r in routes)
