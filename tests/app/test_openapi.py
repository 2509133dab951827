"""The OpenAPI document is the contract: what a client generated from it can rely on.

- the write bodies and the recommend exchange are components, with the limits
  the service is configured with;
- every error answer is one shape (``ErrorBody``), and the app answers in it
  (unknown path, wrong method, a body that is not UTF-8 or not JSON);
- security is declared exactly where a key is asked for, in both settings;
- a client that knows only the document writes an event and a video.

The schemathesis run (``test_schemathesis.py``) checks the same contract by
generating thousands of requests; these tests name each promise on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from app.main import create_app
from tests.app.conftest import KEY, make_settings

READ_KEY = "read-key-for-tests-0123"
READ_ROUTES = {
    ("POST", "/v1/recommend"), ("POST", "/v1/recommend/batch"), ("GET", "/v1/videos/{video_id}"),
    ("GET", "/v1/status"),
}
OPEN_ROUTES = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}


@pytest.fixture()
def document(client: TestClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def validator_for(document: dict[str, Any], component: str) -> Draft202012Validator:
    """A JSON Schema validator of one component, resolving references in the document."""
    registry = Registry().with_resource(
        "urn:doc", DRAFT202012.create_resource(document)
    )
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{component}"},
                                registry=registry)


# --- components ---------------------------------------------------------------------


def test_write_bodies_and_recommend_are_components(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert {"Event", "Video", "RecommendRequest", "RecommendResponse", "ErrorBody"} <= set(schemas)
    events = schemas["EventBatch"]["properties"]["events"]
    assert events["items"] == {"$ref": "#/components/schemas/Event"}
    assert events["maxItems"] == 1000
    videos = schemas["VideoBatch"]["properties"]["videos"]
    assert videos["items"] == {"$ref": "#/components/schemas/Video"}
    assert set(schemas["Event"]["required"]) == {"event_id", "user_id", "video_id", "type", "ts"}
    assert schemas["Event"]["additionalProperties"] is False
    assert "impression" in schemas["EventType"]["enum"]
    # The fields say what they mean (attribute docstrings), with units.
    assert "ms since the Unix epoch" in schemas["Event"]["properties"]["ts"]["description"]
    assert "Idempotency" in schemas["Event"]["properties"]["event_id"]["description"]
    body = document["paths"]["/v1/recommend"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/RecommendRequest")
    answer = document["paths"]["/v1/recommend"]["post"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/RecommendResponse")
    # The items' order is the fused ranking, not the score's: a client must not re-sort.
    response = schemas["RecommendResponse"]["properties"]
    assert "**not** ``score`` order" in response["items"]["description"]
    assert "Not the sort key" in schemas["RecommendItem"]["properties"]["score"]["description"]


def test_limits_in_the_document_follow_the_settings(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path / "data",
        limits={"max_id_length": 40, "max_tags": 5},
        api={"max_events_per_batch": 50, "max_count": 30},
    )
    with TestClient(create_app(settings)) as client:
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
    user_id = schemas["Event"]["properties"]["user_id"]
    assert (user_id["minLength"], user_id["maxLength"]) == (1, 40)
    assert user_id["pattern"] == "^[A-Za-z0-9_.:@/+=-]+$"
    assert schemas["Video"]["properties"]["tags"]["maxItems"] == 5
    assert schemas["EventBatch"]["properties"]["events"]["maxItems"] == 50
    count = schemas["RecommendRequest"]["properties"]["count"]["anyOf"][0]
    assert count["maximum"] == 30


# --- errors ---------------------------------------------------------------------------


def test_every_error_status_is_documented_as_the_error_body(document: dict[str, Any]) -> None:
    error_body = {"#/components/schemas/ErrorBody", "#/components/schemas/BatchRejected"}
    for method, path, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) < 400 or (path, status) in (("/readyz", "503"), ("/healthz", "503")):
                continue  # the probes' 503s are their answers (Readiness, Liveness), not errors
            schema = response["content"]["application/json"]["schema"]
            assert schema["$ref"] in error_body, f"{method} {path} {status}: {schema}"
        if method in ("POST", "PUT"):
            assert "413" in operation["responses"], f"{method} {path}"
    batch = document["components"]["schemas"]["BatchRejected"]
    assert {"error", "message"} <= set(batch["required"])  # an ErrorBody, and more
    responses = document["components"]["responses"]
    assert responses["NotFound"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorBody"
    )
    assert "MethodNotAllowed" in responses
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_unknown_paths_and_methods_answer_in_the_error_shape(
    client: TestClient, document: dict[str, Any]
) -> None:
    error = validator_for(document, "ErrorBody")
    missing = client.get("/v1/nothing-here")
    assert missing.status_code == 404
    error.validate(missing.json())
    assert missing.json()["error"] == "NotFound"
    wrong = client.delete("/v1/events", headers=KEY)
    assert wrong.status_code == 405
    error.validate(wrong.json())
    assert wrong.json()["error"] == "MethodNotAllowed"
    assert wrong.headers["allow"] == "POST"


@pytest.mark.parametrize("path", ["/v1/events", "/v1/videos", "/v1/recommend"])
@pytest.mark.parametrize("raw", [b'{"events": ["\xff\xfe"]}', b'{"events": ['])
def test_unreadable_bodies_name_the_body(
    client: TestClient, document: dict[str, Any], path: str, raw: bytes
) -> None:
    method = "PUT" if path == "/v1/videos" else "POST"
    response = client.request(
        method, path, content=raw, headers={**KEY, "content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    validator_for(document, "ErrorBody").validate(response.json())
    assert response.json()["field"] == "body"
    assert response.json()["message"].startswith("malformed JSON")


def test_a_schema_invalid_video_gets_the_documented_422(
    client: TestClient, document: dict[str, Any]
) -> None:
    response = client.put("/v1/videos", json={"videos": [{}]}, headers=KEY)
    assert response.status_code == 422
    validator_for(document, "BatchRejected").validate(response.json())
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (0, 1)
    assert body["field"] == "videos.0.video_id"  # the first required field it lacks


def test_json_types_are_taken_as_the_schema_says(client: TestClient) -> None:
    """``"5"`` is no integer and ``1`` no boolean; ``5.0`` is an integer (JSON Schema)."""
    now = int(time.time() * 1000)
    event = {"event_id": "t1", "user_id": "u1", "video_id": "v1", "type": "play", "ts": now}
    cases = [
        ({**event, "ts": str(now)}, "ts"),
        ({**event, "watch_ms": True}, "watch_ms"),
        ({**event, "context": {"position": "3"}}, "context.position"),
    ]
    for bad, field in cases:
        response = client.post("/v1/events", json={"events": [bad]}, headers=KEY)
        assert response.status_code == 422, bad
        assert response.json()["errors"][0]["field"] == field
    whole = {**event, "event_id": "t2", "ts": float(now), "context": {"position": 3.0}}
    response = client.post("/v1/events", json={"events": [whole]}, headers=KEY)
    assert response.json()["accepted"] == 1, response.text
    assert client.post("/v1/recommend", json={"user_id": "u1", "count": 5.0}).status_code == 200
    refused = client.post("/v1/recommend", json={"user_id": "u1", "exclude_seen": 1})
    assert refused.status_code == 422 and refused.json()["field"] == "exclude_seen"


def test_metrics_are_documented_as_text(client: TestClient, document: dict[str, Any]) -> None:
    ok = document["paths"]["/metrics"]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["text/plain"]
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_retrain_takes_an_empty_body(tmp_path: Path, document: dict[str, Any]) -> None:
    """Every dashboard action has its own body; ``from_ts_ms`` defaults to the log's start."""
    retrain = document["paths"]["/dashboard/api/actions/retrain"]["post"]
    ref = retrain["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "required" not in schema and schema["properties"]["from_ts_ms"]["default"] == 0
    promote = document["paths"]["/dashboard/api/actions/promote"]["post"]
    ref = promote["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert document["components"]["schemas"][ref.rsplit("/", 1)[1]]["required"] == ["version"]
    settings = make_settings(tmp_path / "data", dashboard={"ack_timeout_s": 0.05})
    with TestClient(create_app(settings)) as client:
        response = client.post("/dashboard/api/actions/retrain", json={}, headers=KEY)
        assert response.status_code == 200, response.text
        assert response.json()["args"] == {"from_ts_ms": 0}
        assert response.json()["status"] == "timeout"  # no trainer listens here
        # An operator's version name never reaches the file system as a path.
        for name in ("../../etc", "a\x00b"):
            bad = client.post("/dashboard/api/actions/promote", json={"version": name},
                              headers=KEY)
            assert bad.status_code == 422 and bad.json()["field"] == "version"


# --- security -------------------------------------------------------------------------


@pytest.mark.parametrize("read_key", [None, READ_KEY])
def test_security_is_declared_exactly_where_a_key_is_asked_for(
    tmp_path: Path, read_key: str | None
) -> None:
    settings = make_settings(tmp_path / "data", api={"read_key": read_key})
    with TestClient(create_app(settings)) as client:
        document = client.get("/openapi.json").json()
        schemes = document["components"]["securitySchemes"]
        assert schemes["ApiKey"] == {
            "type": "apiKey", "in": "header", "name": "X-API-Key",
            "description": schemes["ApiKey"]["description"],
        }
        for method, path, operation in operations(document):
            declared = "security" in operation
            if (method, path) in OPEN_ROUTES:
                assert not declared, path
            elif (method, path) in READ_ROUTES:
                assert declared == (read_key is not None), f"{method} {path}"
            else:
                assert declared, f"{method} {path}"
            assert ("401" in operation["responses"]) == declared, f"{method} {path}"
            url = path.replace("{video_id}", "v1").replace("{user_id}", "u1")
            url = url.replace("{command_id}", "c1")
            answer = client.request(method, url, json={"user_id": "u1"})
            assert (answer.status_code == 401) == declared, f"{method} {path}: {answer.text}"


# --- a client from the document alone -------------------------------------------------


def example(schema: dict[str, Any], document: dict[str, Any]) -> Any:
    """The simplest instance of ``schema``, read from the document and nothing else."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return example(document["components"]["schemas"][name], document)
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return example(next(s for s in schema["anyOf"] if s.get("type") != "null"), document)
    kind = schema.get("type")
    if kind == "object":
        return {
            name: example(schema["properties"][name], document)
            for name in schema.get("required", [])
        }
    if kind == "array":
        count = max(1, schema.get("minItems", 0))
        return [example(schema["items"], document) for _ in range(count)]
    if kind == "integer":
        if "exclusiveMinimum" in schema:
            return schema["exclusiveMinimum"] + 1
        return schema.get("minimum", 0)
    if kind == "string":
        assert schema.get("pattern", "^[A-Za-z0-9_.:@/+=-]+$") == "^[A-Za-z0-9_.:@/+=-]+$"
        return "x" * max(1, schema.get("minLength", 1))
    if kind == "boolean":
        return False
    raise AssertionError(f"no example for {schema}")


def test_a_client_built_from_the_document_alone_writes_events_and_videos(
    client: TestClient,
) -> None:
    """What a generated client does: read the document, build the bodies, call the paths."""
    document = client.get("/openapi.json").json()
    scheme = document["components"]["securitySchemes"]["ApiKey"]
    auth = {scheme["name"]: "vidrec-dev-key"}
    calls = {}
    for method, path, operation in operations(document):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if path in ("/v1/events", "/v1/videos") and body is not None:
            instance = example(body["schema"], document)
            validator_for(document, body["schema"]["$ref"].rsplit("/", 1)[1]).validate(instance)
            calls[path] = client.request(method, path, json=instance, headers=auth)
    for path, response in calls.items():
        assert response.status_code == 200, f"{path}: {response.text}"
        validator_for(document, "BatchResult").validate(response.json())
        assert response.json() == {"accepted": 1, "rejected": 0, "errors": [], "warnings": []}, path
    video = client.get("/v1/videos/x")
    assert video.status_code == 200 and video.json()["category"] == "x"
    logged = json.dumps(calls["/v1/events"].request.content.decode())
    assert "946684800000" in logged  # the schema's own lower bound on ts, accepted
