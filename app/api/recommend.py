"""``POST /v1/recommend``.

The handler is ``async`` and scores inline on the event loop instead of in
FastAPI's thread pool: the work is a few milliseconds of CPU under the GIL,
so a thread hop adds latency and, under concurrency, GIL hand-offs between
pool threads cost more than they overlap (measured: see docs/benchmarks.md).
A worker thus scores one request at a time; scale with worker processes.
The price: while a backend call hangs (up to ``redis.socket_timeout_s``) this
worker's loop waits too, which the degraded fallback then answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from app.api.dependencies import ServiceDep
from app.auth import require
from app.schemas import ErrorBody, RecommendRequest, RecommendResponse

router = APIRouter(tags=["recommend"])


@router.post(
    "/v1/recommend",
    response_model=RecommendResponse,
    dependencies=[Depends(require("read"))],
    responses={401: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
async def recommend(body: RecommendRequest, service: ServiceDep) -> Response:
    """Rank videos for a user.

    Without ``candidates`` the service retrieves its own (co-visitation,
    creators, trending, fresh uploads), filters out hidden, already-seen and
    filtered-out videos and scores at most ``api.max_candidates``. An unknown
    user, a missing model or a backend outage is answered by a fallback
    (``fallback``/``fallback_reason``/``degraded``), never an error.
    """
    result = service.recommender.recommend(body)
    # Already a validated model: serialise once, skip FastAPI's re-validation.
    return Response(result.model_dump_json(), media_type="application/json")
