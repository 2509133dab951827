"""``POST /v1/recommend``."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from app.api.dependencies import get_service
from app.auth import require
from app.schemas import ErrorBody, RecommendRequest, RecommendResponse
from app.service import Service

router = APIRouter(tags=["recommend"])


@router.post(
    "/v1/recommend",
    response_model=RecommendResponse,
    dependencies=[Depends(require("read"))],
    responses={401: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def recommend(
    body: RecommendRequest, service: Service = Depends(get_service)
) -> RecommendResponse:
    """Rank videos for a user.

    Without ``candidates`` the service retrieves its own (co-visitation,
    creators, trending, fresh uploads), filters out hidden, already-seen and
    filtered-out videos and scores at most ``api.max_candidates``. An unknown
    user, a missing model or a backend outage is answered by a fallback
    (``fallback``/``fallback_reason``/``degraded``), never an error.
    """
    return service.recommender.recommend(body)
