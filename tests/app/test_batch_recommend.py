"""``POST /v1/recommend/batch`` on a real socket: many users, one request, same limits and key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.app.conftest import make_settings, publish_model, serve_in_thread, wait_for
from tests.factories import make_video

READ_KEY = {"X-API-Key": "reader-key-for-batch-tests"}
VIDEOS = [make_video(video_id=f"b{i}", category=f"k{i % 4}") for i in range(40)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    """The service with a model and a catalog, reads behind a key, a batch limit of 5."""
    settings = make_settings(
        tmp_path_factory.mktemp("batch") / "data",
        api={"read_key": READ_KEY["X-API-Key"], "max_recommend_batch": 5},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        service = app.state.service
        service.resources.catalog.upsert(VIDEOS)
        version = publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None and service.model.version == version)
        yield http, version


def batch(http: httpx.Client, requests: list[dict[str, Any]], **headers: str) -> httpx.Response:
    return http.post("/v1/recommend/batch", json={"requests": requests},
                     headers={**READ_KEY, **headers})


def test_each_user_gets_a_whole_recommendation_in_order(
    served: tuple[httpx.Client, str]
) -> None:
    http, version = served
    candidates = [v.video_id for v in VIDEOS]
    asks = [
        {"user_id": "ann", "candidates": candidates, "count": 3},
        {"user_id": "bob", "candidates": candidates[:10], "count": 10,
         "filters": {"categories": ["k1"]}},
        {"user_id": "cy", "count": 4},
    ]
    response = batch(http, asks)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["user_id"] for r in results] == ["ann", "bob", "cy"]
    assert [len(r["items"]) for r in results[:2]] == [3, 3]  # bob: only k1 among his 10
    assert all(item["video_id"] in {"b1", "b5", "b9"} for item in results[1]["items"])
    assert all(r["model_version"] == version for r in results)
    assert len({r["recommendation_id"] for r in results}) == 3  # each attributable alone
    assert all(r["fallback"] is False for r in results[:2])
    assert results[2]["fallback_reason"] == "unknown_user"  # a fallback, never an error


def test_same_key_and_limits_as_one_recommend(served: tuple[httpx.Client, str]) -> None:
    http, _ = served
    one = [{"user_id": "ann", "count": 2}]
    no_key = http.post("/v1/recommend/batch", json={"requests": one})
    assert no_key.status_code == 401 and no_key.json()["error"] == "Unauthorized"

    too_many = batch(http, one * 6)
    assert too_many.status_code == 413
    assert too_many.json()["message"].startswith("requests: 6 users, at most 5")

    checks = [
        ([{"user_id": "ann"}, {"user_id": "bob", "count": 501}], "requests.1.count"),
        ([{"user_id": "ann", "nope": 1}], "requests.0.nope"),
        ([{"user_id": "a b"}], "requests.0.user_id"),
        ([{"user_id": "x" * 300}], "requests.0.user_id"),
        ([{"count": 2}], "requests.0.user_id"),
        ([], "requests"),
    ]
    for requests, field in checks:
        refused = batch(http, requests)
        assert refused.status_code == 422, (requests, refused.text)
        assert refused.json()["field"] == field, refused.json()
    missing = http.post("/v1/recommend/batch", json={"users": ["ann"]}, headers=READ_KEY)
    assert missing.status_code == 422 and missing.json()["field"] in {"requests", "users"}


def test_the_document_describes_the_batch(served: tuple[httpx.Client, str]) -> None:
    http, _ = served
    document = http.get("/openapi.json").json()
    operation = document["paths"]["/v1/recommend/batch"]["post"]
    schemas = document["components"]["schemas"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schemas[ref.rsplit("/", 1)[1]]
    assert body["properties"]["requests"]["maxItems"] == 5
    item = body["properties"]["requests"]["items"]
    assert item == {"$ref": "#/components/schemas/RecommendRequest"}
    assert {"200", "401", "413", "422"} <= set(operation["responses"])
    assert operation["security"]  # a read key is set: declared
