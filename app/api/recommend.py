"""``POST /v1/recommend`` and ``POST /v1/recommend/batch``.

The handlers are ``async``: they parse the body on the event loop and hand
the scoring to the service's one scoring thread
(:class:`app.admission.ScoringThread`), waiting for it at most until the
request's deadline; a request not scored by then is answered from the
popular list (``fallback_reason: "deadline"``). The loop itself never
scores, so ``/healthz``, refusals and other requests never wait behind a
scoring, nor behind a backend call that hangs (up to
``redis.socket_timeout_s``; after the first, the Redis client's circuit
breaker, :mod:`feature_store.runtime.breaker`, fails every call in microseconds
until Redis answers a background PING). One thread, as the loop was before:
a worker scores one request at a time and scales by processes (a pool of
threads trading the GIL served fewer: docs/benchmarks.md).

The body is parsed here, by pydantic-core straight from the raw bytes
(``model_validate_json``), not by FastAPI's body parameter (``json.loads``,
then validation through FastAPI's dependency machinery): about 0.3 ms less
per request. Errors read the same (they go through the same
``RequestValidationError`` translation), and the OpenAPI document still
describes the body (:data:`OPENAPI_BODY`, :func:`add_request_schemas`).

A batch (many users in one request: e-mail and push jobs) is the same
recommendations one after the other, with the same limits per user and the
same key, at most ``api.max_recommend_batch`` users; each user is one job of
the scoring thread, so online requests are scored between a batch's users,
and a batch's users wait for no deadline (a job wants whole answers).
"""

from __future__ import annotations

from functools import partial
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from app.admission import RECOMMEND, deadline_of
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
from feature_store.json_keys import REPEATED_KEY, keys_in, repeated_keys

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
    """The request body as ``model``; errors as FastAPI reports them, and a key given
    twice refused (:mod:`feature_store.json_keys`)."""
    if not raw:
        raise InvalidInput("body", "required")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidInput("body", "expected a JSON object (Content-Type: application/json)")
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        raise _in_body(exc) from exc
    repeated = repeated_keys(raw, keys_in(body))
    if repeated:
        raise InvalidInput(repeated[0], REPEATED_KEY)
    return body


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

    Without ``candidates`` the service retrieves its own from the sources of
    ``api.candidate_sources`` (two-tower embedding, co-visitation, categories,
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
        scored = await service.scoring.run(partial(recommender.recommend, one), None)
        assert scored is not None  # no deadline: always scored
        answers.append(
            BatchRecommendation(**scored.__dict__, user_id=one.user_id).model_dump_json()
        )
    return Response('{"results":[' + ",".join(answers) + "]}", media_type="application/json")
