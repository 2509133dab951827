"""The OpenAPI document as the contract a generated client can rely on.

FastAPI derives most of the document from the routes; this module finishes
it with what only the running configuration knows, once per app (the
document is cached):

- **Write bodies.** Events and videos arrive as raw JSON and are validated
  one by one (a bad item does not sink its batch), so their routes declare
  the items by reference; the ``Event`` and ``Video`` components are added
  here, with every limit the validators apply that JSON Schema can say (id
  charset and ``limits.max_id_length``, watch-time bounds, tag counts,
  ``api.max_events_per_batch``...). One limit cannot be said: an event's
  ``ts`` (a video's ``uploaded_at``) may be at most
  ``limits.future_tolerance_ms`` ahead of the receiver's clock; such an item
  is rejected as an item (``ts`` or ``uploaded_at`` named).
- **Errors.** Every error answer is one shape, :class:`~app.schemas.ErrorBody`.
  Routes declare the statuses only they can give (``responses=errors(404)``);
  the ones that follow from a route's form are added here: 401 where a key
  is needed, 413 on every method with a body (``api.max_body_bytes``), 422
  wherever a parameter or body is parsed. Unknown paths (404) and methods
  (405, with ``Allow``) answer in the same shape, as ``components.responses``.
- **Security where it is enforced.** Writes and admin calls always need a
  key; reads (recommend, ``GET /v1/videos/{id}``, status) only when
  ``api.read_key`` is set, and only then does the document declare it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app.auth import RoleCheck
from app.schemas import BatchRejected, ErrorBody
from feature_store.catalog.base import Video
from feature_store.events import ID_CHARSET_TEXT, Event
from feature_store.settings import Settings

ID_PATTERN = r"^[A-Za-z0-9_.:@/+=-]+$"
"""The id charset (:data:`feature_store.events.ID_CHARSET`) as a JSON Schema pattern."""

REF = "#/components/schemas/{model}"

ERROR_DESCRIPTIONS = {
    401: "Missing or wrong API key (`X-API-Key: <key>` or `Authorization: Bearer <key>`).",
    403: "The key is valid but its role may not do this.",
    404: "Not found; `message` names what.",
    405: "Method not allowed on this path; the `Allow` header lists the methods that are.",
    409: "A state change that cannot apply now.",
    413: "Body over `api.max_body_bytes`, or a batch over its item limit.",
    422: "Invalid input: `field` names the offending field (`body` when the body itself "
    "could not be read: malformed JSON, not UTF-8, not a JSON object).",
    429: "Too many requests of this kind are waiting (pending admin actions); retry after "
    "`Retry-After` seconds.",
    503: "A backend (Redis, Kafka) is unreachable or did not answer in time, the service "
    "is starting or stopping, or it is overloaded (`Overloaded`: as many of these requests "
    "in flight as it serves at once, or the request's deadline passed); nothing was "
    "acknowledged: retry after `Retry-After` seconds (resending events with the same "
    "`event_id`s is safe: each is trained once).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for error statuses, all as :class:`ErrorBody`."""
    return {s: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


BATCH_REJECTED: dict[str, Any] = {
    "model": BatchRejected,
    "description": "Every item was rejected (`accepted` 0; `errors` names each item's field), "
    "or the body itself is invalid (`field` names it).",
}
"""The 422 of a batch write (``POST /v1/events``, ``PUT /v1/videos``)."""


def _error_response(status: int) -> dict[str, Any]:
    return {
        "description": ERROR_DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}},
    }


def id_schema(max_length: int) -> dict[str, Any]:
    """A string in the id charset, ``1..max_length`` characters."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": ID_PATTERN}


def _narrow(prop: dict[str, Any], **constraints: Any) -> None:
    """Add constraints to a property, or to the non-null branch of an optional one."""
    branches = [b for b in prop.get("anyOf", []) if b.get("type") != "null"]
    (branches[0] if branches else prop).update(constraints)


def _as_id(prop: dict[str, Any], max_length: int) -> None:
    """Make a (possibly optional) string property an id, and say so in its description."""
    _narrow(prop, **id_schema(max_length))
    rule = f"{ID_CHARSET_TEXT}; 1 to {max_length} characters"
    prop["description"] = f"{prop['description']} ({rule})" if "description" in prop else rule


def _model_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """``model`` and the models it uses, as component schemas."""
    schema = copy.deepcopy(model.model_json_schema(ref_template=REF))
    found: dict[str, dict[str, Any]] = schema.pop("$defs", {})
    found[model.__name__] = schema
    return found


def write_schemas(settings: Settings) -> dict[str, dict[str, Any]]:
    """``Event``, ``EventContext``, ``EventType`` and ``Video`` with the configured limits."""
    limits = settings.limits
    max_id = limits.max_id_length
    schemas = {**_model_schemas(Event), **_model_schemas(Video)}

    event = schemas["Event"]["properties"]
    for name in ("event_id", "user_id", "video_id", "recommendation_id", "model_version"):
        _as_id(event[name], max_id)
    event["ts"].update(
        minimum=limits.min_ts_ms,
        description=(
            "Event time, ms since the Unix epoch; at most "
            f"{limits.future_tolerance_ms} ms ahead of the receiver's clock."
        ),
    )
    event["watch_ms"].update(minimum=0, maximum=limits.max_watch_ms)
    _narrow(event["duration_ms"], minimum=1, maximum=limits.max_watch_ms)

    video = schemas["Video"]["properties"]
    for name in ("video_id", "creator_id"):
        _as_id(video[name], max_id)
    _as_id(video["category"], 64)
    video["tags"].update(maxItems=limits.max_tags)
    _as_id(video["tags"]["items"], 64)
    video["duration_ms"].update(maximum=limits.max_watch_ms)
    video["uploaded_at"].update(
        description=(
            "Upload time, ms since the Unix epoch; at most "
            f"{limits.future_tolerance_ms} ms ahead of the receiver's clock."
        ),
    )
    return schemas


def _tighten_recommend(schemas: dict[str, Any], settings: Settings) -> None:
    request = schemas.get("RecommendRequest")
    if request is None:
        return
    props = request["properties"]
    max_id = settings.limits.max_id_length
    _as_id(props["user_id"], max_id)
    _narrow(props["count"], maximum=settings.api.max_count)
    _narrow(props["candidates"], maxItems=settings.api.max_candidates)
    for branch in props["candidates"]["anyOf"]:
        if branch.get("type") == "array":
            branch["items"].update(maxLength=max_id)


def _batch_limits(schemas: dict[str, Any], settings: Settings) -> None:
    for model, field, limit in (
        ("EventBatch", "events", settings.api.max_events_per_batch),
        ("VideoBatch", "videos", settings.api.max_videos_per_batch),
        ("BatchRecommendRequest", "requests", settings.api.max_recommend_batch),
    ):
        if model in schemas:
            schemas[model]["properties"][field]["maxItems"] = limit


ID_PARAMETERS = frozenset({"video_id", "user_id"})
"""Path parameters checked against the id charset and ``limits.max_id_length``."""


def _operations(
    document: dict[str, Any], routers: Iterable[APIRouter]
) -> Iterable[tuple[APIRoute, str, dict[str, Any]]]:
    """(route, method, its operation in ``document``) for every documented route."""
    paths = document.get("paths", {})
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in sorted(route.methods or ()):
            operation = paths.get(route.path_format, {}).get(method.lower())
            if operation is not None:
                yield route, method, operation


def _role_check(route: APIRoute) -> RoleCheck | None:
    for dependency in route.dependant.dependencies:
        if isinstance(dependency.call, RoleCheck):
            return dependency.call
    return None


def _finish_operation(
    route: APIRoute, method: str, operation: dict[str, Any], settings: Settings
) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    check = _role_check(route)
    if check is not None:
        if check.needs_key(settings.api):
            responses.setdefault("401", _error_response(401))
        else:  # an open read: no key asked, none declared
            operation.pop("security", None)
            responses.pop("401", None)
    if "security" in operation:
        responses.setdefault("401", _error_response(401))
    if method in ("POST", "PUT", "PATCH"):
        responses.setdefault("413", _error_response(413))
    for status, response in responses.items():
        content = response.get("content", {})
        is_error = status.isdigit() and int(status) >= 400
        if is_error and content and "application/json" not in content:
            # Errors are JSON even where the success is not (FastAPI files them under
            # the route's media type: text/plain for /metrics).
            response["content"] = {"application/json": next(iter(content.values()))}
    default_422 = responses.get("422", {}).get("content", {}).get("application/json", {})
    if default_422.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
        responses["422"] = _error_response(422)
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path" and parameter["name"] in ID_PARAMETERS:
            _as_id(parameter["schema"], settings.limits.max_id_length)


def contract(
    document: dict[str, Any], routers: Iterable[APIRouter], settings: Settings
) -> dict[str, Any]:
    """Finish FastAPI's ``document`` of the app made of ``routers`` under ``settings``.

    ``routers`` are the app's routers as included (their routes carry their
    prefix), walked to learn which role each operation needs (module doc).
    """
    components = document.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    for name, schema in write_schemas(settings).items():
        schemas[name] = schema
    _tighten_recommend(schemas, settings)
    _batch_limits(schemas, settings)
    for route, method, operation in _operations(document, routers):
        _finish_operation(route, method, operation, settings)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components.setdefault("responses", {}).update(
        {"NotFound": _error_response(404), "MethodNotAllowed": _error_response(405)}
    )
    return document
