"""``POST /v1/recommend`` and ``POST /v1/recommend/batch``.

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
A batch (many users in one request: e-mail and push jobs) is the same
recommendations one after the other, with the same limits per user and the
same key, at most ``api.max_recommend_batch`` users; the handler yields to the
event loop between users, so a batch never holds the worker for more than one
user's few milliseconds at a time.

The price: while a backend call hangs (up to ``redis.socket_timeout_s``) this
worker's loop waits too, which the degraded fallback then answers. Only the
calls that find Redis gone pay that: then the client's circuit breaker
(:mod:`feature_store.breaker`) fails every call in microseconds until Redis
answers a background PING, so an outage never costs a request the client's
retries and backoff on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from app.api.dependencies import get_service
from app.auth import require
from app.openapi import errors
from app.schemas import (
    BatchRecommendation,
    BatchRecommendRequest,
    BatchRecommendResponse,
    RecommendRequest,
    RecommendResponse,
)
from feature_store.errors import InvalidInput, PayloadTooLarge

router = APIRouter(tags=["recommend"])

Body = TypeVar("Body", RecommendRequest, BatchRecommendRequest)


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """A request body as FastAPI would have documented it."""
    ref = f"#/components/schemas/{model.__name__}"
    return {"required": True, "content": {"application/json": {"schema": {"$ref": ref}}}}


OPENAPI_BODY = _body(RecommendRequest)
BATCH_OPENAPI_BODY = _body(BatchRecommendRequest)


def add_request_schemas(document: dict[str, Any]) -> dict[str, Any]:
    """Add the request bodies parsed here, and the models they use, to a document's
    components (FastAPI documents only the bodies it parses itself)."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (RecommendRequest, BatchRecommendRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in schema.pop("$defs", {}).items():
            schemas.setdefault(name, definition)
        schemas.setdefault(model.__name__, schema)
    return document


def parse_request(content_type: str | None, raw: bytes) -> RecommendRequest:
    """The request body as :class:`RecommendRequest`; errors as FastAPI reports them."""
    return parse_body(content_type, raw, RecommendRequest)


def parse_body(content_type: str | None, raw: bytes, model: type[Body]) -> Body:
    """The request body as ``model``; errors as FastAPI reports them."""
    if not raw:
        raise InvalidInput("body", "required")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidInput("body", "expected a JSON object (Content-Type: application/json)")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise _in_body(exc) from exc


def _in_body(exc: ValidationError) -> RequestValidationError:
    """pydantic's errors located in the body, as FastAPI's own parsing reports them."""
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])


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


@router.post(
    "/v1/recommend/batch",
    response_model=BatchRecommendResponse,
    dependencies=[Depends(require("read"))],
    openapi_extra={"requestBody": BATCH_OPENAPI_BODY},
    responses=errors(413, 422, 503),
)
async def recommend_batch(request: Request) -> Response:
    """Rank videos for many users at once (e-mail and push jobs).

    Each entry of ``requests`` is what ``POST /v1/recommend`` takes, with its
    limits and the same key; at most ``api.max_recommend_batch`` entries (413
    beyond). Every entry is checked before any is answered: one invalid entry
    is a 422 naming it (``requests.3.user_id``) and nothing is recommended.
    The answers come in the order of ``requests``, each a whole recommendation
    with its ``user_id`` (fallbacks included: a user is never an error).
    """
    service = await get_service(request)
    body = parse_body(
        request.headers.get("content-type"), await request.body(), BatchRecommendRequest
    )
    limit = service.resources.settings.api.max_recommend_batch
    if len(body.requests) > limit:
        raise PayloadTooLarge(
            f"requests: {len(body.requests)} users, at most {limit} per batch "
            "(api.max_recommend_batch)"
        )
    recommender = service.recommender
    for index, one in enumerate(body.requests):
        try:
            recommender.validate(one)
        except InvalidInput as exc:
            raise InvalidInput(f"requests.{index}.{exc.field}", exc.reason) from exc
    answers: list[str] = []
    for one in body.requests:
        result = recommender.recommend(one)
        answers.append(
            BatchRecommendation(**result.__dict__, user_id=one.user_id).model_dump_json()
        )
        await asyncio.sleep(0)  # let the worker answer others between users
    return Response('{"results":[' + ",".join(answers) + "]}", media_type="application/json")
