"""``POST /v1/recommend``.

The handler is ``async`` and scores inline on the event loop instead of in
FastAPI's thread pool: the work is a few milliseconds of CPU under the GIL,
so a thread hop adds latency and, under concurrency, GIL hand-offs between
pool threads cost more than they overlap (measured: see docs/benchmarks.md).
A worker thus scores one request at a time; scale with worker processes.

The body is parsed here, by pydantic-core straight from the raw bytes
(``model_validate_json``), not by FastAPI's body parameter (``json.loads``,
then validation through FastAPI's dependency machinery): about 0.3 ms less
per request. Errors read the same (they go through the same
``RequestValidationError`` translation), and the OpenAPI document still
describes the body (:data:`OPENAPI_BODY`, :func:`add_request_schemas`).
The price: while a backend call hangs (up to ``redis.socket_timeout_s``) this
worker's loop waits too, which the degraded fallback then answers. Only the
calls that find Redis gone pay that: then the client's circuit breaker
(:mod:`feature_store.breaker`) fails every call in microseconds until Redis
answers a background PING, so an outage never costs a request the client's
retries and backoff on the event loop.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.dependencies import get_service
from app.auth import require
from app.openapi import errors
from app.schemas import RecommendRequest, RecommendResponse
from feature_store.errors import InvalidInput

router = APIRouter(tags=["recommend"])

_REQUEST_SCHEMA = RecommendRequest.model_json_schema(ref_template="#/components/schemas/{model}")
OPENAPI_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RecommendRequest"}}},
}
"""The request body as FastAPI would have documented it."""


def add_request_schemas(document: dict[str, Any]) -> dict[str, Any]:
    """Add ``RecommendRequest`` and the models it uses to an OpenAPI document's components."""
    schema = dict(_REQUEST_SCHEMA)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas.setdefault("RecommendRequest", schema)
    return document


def parse_request(content_type: str | None, raw: bytes) -> RecommendRequest:
    """The request body as :class:`RecommendRequest`; errors as FastAPI reports them."""
    if not raw:
        raise InvalidInput("body", "required")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidInput("body", "expected a JSON object (Content-Type: application/json)")
    try:
        return RecommendRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from exc


@router.post(
    "/v1/recommend",
    response_model=RecommendResponse,
    dependencies=[Depends(require("read"))],
    openapi_extra={"requestBody": OPENAPI_BODY},
    responses=errors(422, 503),
)
async def recommend(request: Request) -> Response:
    """Rank videos for a user.

    Without ``candidates`` the service retrieves its own (co-visitation,
    creators, trending, fresh uploads), filters out hidden, already-seen and
    filtered-out videos and scores at most ``api.max_candidates``. An unknown
    user, a missing model or a backend outage is answered by a fallback
    (``fallback``/``fallback_reason``/``degraded``), never an error.
    """
    service = await get_service(request)
    body = parse_request(request.headers.get("content-type"), await request.body())
    result = service.recommender.recommend(body)
    # Already a validated model: serialise once, skip FastAPI's re-validation.
    return Response(result.model_dump_json(), media_type="application/json")
