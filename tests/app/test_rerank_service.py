"""Rerank in the running service: the served log feeds exclude_served, events feed dislikes."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.app.conftest import KEY, make_settings, publish_model, service_of, wait_for
from tests.app.test_api import event_json, put_videos, video_json, with_model


def recommend(client: TestClient, **body: object) -> list[str]:
    response = client.post("/v1/recommend", json={"user_id": "u9", **body})
    assert response.status_code == 200, response.text
    return [item["video_id"] for item in response.json()["items"]]


def test_served_pages_are_not_served_again_and_dislikes_never_come_back(
    client: TestClient,
) -> None:
    put_videos(client, [video_json(video_id=f"clip{i}", creator_id=f"c{i}") for i in range(30)])
    with_model(client)
    feedback = service_of(client).feedback

    first = recommend(client, count=5, exclude_served=True)
    assert len(first) == 5
    wait_for(lambda: len(feedback.read("u9", int(time.time() * 1000)).served) == 5)
    second = recommend(client, count=5, exclude_served=True)
    assert len(second) == 5 and not set(first) & set(second)

    disliked = second[0]
    response = client.post(
        "/v1/events",
        json={"events": [event_json(user_id="u9", video_id=disliked, type="dislike")]},
        headers=KEY,
    )
    assert response.status_code == 200, response.text
    wait_for(lambda: disliked in feedback.read("u9", int(time.time() * 1000)).disliked)
    for _ in range(3):
        assert disliked not in recommend(client, count=30, exclude_served=False)


def test_exclude_served_must_be_a_boolean(client: TestClient) -> None:
    response = client.post("/v1/recommend", json={"user_id": "u1", "exclude_served": "yes"})
    assert response.status_code == 422 and response.json()["field"] == "exclude_served"


@pytest.mark.redis
def test_every_serving_process_sees_the_same_exclusions(tmp_path: Path, redis_url: str) -> None:
    """Two services over one Redis: what one served, the other does not serve again."""
    settings = make_settings(
        tmp_path / "data",
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        rerank={"exclude_served": True},
    )
    with ExitStack() as stack:
        one = stack.enter_context(TestClient(create_app(settings)))
        two = stack.enter_context(TestClient(create_app(settings)))
        put_videos(one, [video_json(video_id=f"clip{i}", creator_id=f"c{i}") for i in range(30)])
        resources = service_of(one).resources
        version = publish_model(resources.registry, resources.schema)
        for client in (one, two):
            service = service_of(client)
            wait_for(lambda s=service: s.model is not None and s.model.version == version)
        feedback = service_of(two).feedback
        first = recommend(one, count=5)  # exclude_served from the setting
        assert len(first) == 5
        wait_for(lambda: len(feedback.read("u9", int(time.time() * 1000)).served) == 5)
        second = recommend(two, count=5)
        assert len(second) == 5 and not set(first) & set(second)
