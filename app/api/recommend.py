"""``POST /v1/recommend``.

The handler is ``async``: it parses the body on the event loop and hands the
scoring to the service's one scoring thread (:class:`app.admission.ScoringThread`),
waiting for it at most until the request's deadline; a request not scored
by then is answered from the popular list (``fallback_reason: "deadline"``).
The loop itself never scores, so ``/healthz``, refusals and other requests
never wait behind a scoring, nor behind a backend call that hangs (up to
``redis.socket_timeout_s``; after the first, the Redis client's circuit
breaker, :mod:`feature_store.breaker`, fails every call in microseconds
until Redis answers a background PING). One thread, as the loop was before:
a worker scores one request at a time and scales by processes (a pool of
threads trading the GIL served fewer: docs/benchmarks.md).

The body is parsed here, by pydantic-core straight from the raw bytes
(``model_validate_json``), not by FastAPI's body parameter (``json.loads``,
then validation through FastAPI's dependency machinery): about 0.3 ms less
per request. Errors read the same (they go through the same
``RequestValidationError`` translation), and the OpenAPI document still
describes the body (:data:`OPENAPI_BODY`, :func:`add_request_schemas`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from app.admission import RECOMMEND, deadline_of
from app.api.dependencies import get_service
from app.auth import require
from app.openapi import errors
from app.schemas import RecommendRequest, RecommendResponse
from feature_store.errors import InvalidInput
from feature_store.json_keys import REPEATED_KEY, keys_in, repeated_keys

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
    """The request body as :class:`RecommendRequest`; errors as FastAPI reports them, and a
    key given twice refused (:mod:`feature_store.json_keys`)."""
    if not raw:
        raise InvalidInput("body", "required")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidInput("body", "expected a JSON object (Content-Type: application/json)")
    try:
        request = RecommendRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from exc
    repeated = repeated_keys(raw, keys_in(request))
    if repeated:
        raise InvalidInput(repeated[0], REPEATED_KEY)
    return request


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
    (``fallback``/``fallback_reason``/``degraded``), never an error; so is a request
    not scored by ``api.recommend_deadline_ms`` (``fallback_reason: "deadline"``).
    503 ``Overloaded`` with ``Retry-After`` when ``api.max_concurrent_recommends`` are
    in flight already: retry after it (or show what the client had).
    """
    service = await get_service(request)
    body = parse_request(request.headers.get("content-type"), await request.body())
    recommender = service.recommender
    result = await service.scoring.run(
        lambda: recommender.recommend(body), deadline_of(request.scope)
    )
    if result is None:  # not scored in time: shed, answered from memory
        service.metrics.shed.labels(RECOMMEND, "deadline").inc()
        result = recommender.past_deadline(body)
    # Already a validated model: serialise once, skip FastAPI's re-validation.
    return Response(result.model_dump_json(), media_type="application/json")
