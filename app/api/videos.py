"""The catalog: batch upsert, read, hide and unhide."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.api.dependencies import RawBody, ServiceDep
from app.api.events import batch_response, item_id, repeated_item_keys
from app.auth import require
from app.openapi import BATCH_REJECTED, errors
from app.schemas import BatchResult, ItemError, VideoBatch, VideoOut
from app.service import Service
from feature_store.catalog.base import Video, validate_video
from feature_store.errors import InvalidInput, NotFound, PayloadTooLarge
from feature_store.events import check_id
from feature_store.json_keys import REPEATED_KEY

router = APIRouter(tags=["catalog"])


@router.put(
    "/v1/videos",
    response_model=BatchResult,
    dependencies=[Depends(require("write"))],
    responses={**errors(503), 422: BATCH_REJECTED},
)
def put_videos(
    body: VideoBatch, service: ServiceDep, raw: RawBody
) -> BatchResult | JSONResponse:
    """Insert or replace videos; same response shape and statuses as ``POST /v1/events``."""
    settings = service.resources.settings
    limit = settings.api.max_videos_per_batch
    if len(body.videos) > limit:
        raise PayloadTooLarge(f"videos: {len(body.videos)} videos, at most {limit} per batch")
    valid: list[Video] = []
    errors: list[ItemError] = []
    repeated = repeated_item_keys(raw, "videos", body.videos)
    for index, item in enumerate(body.videos):
        try:
            if index in repeated:
                raise InvalidInput(repeated[index], REPEATED_KEY)
            valid.append(validate_video(item, settings.limits))
        except InvalidInput as exc:
            errors.append(
                ItemError(
                    index=index, id=item_id(item, "video_id"), field=exc.field, message=exc.reason
                )
            )
    if valid:
        service.resources.catalog.upsert(valid)
        service.reads.forget_videos(v.video_id for v in valid)
        service.signals.index_videos(valid)
    return batch_response(
        BatchResult(accepted=len(valid), rejected=len(errors), errors=errors), "videos"
    )


def _video_id(service: Service, video_id: str) -> str:
    check_id("video_id", video_id, service.resources.settings.limits.max_id_length)
    return video_id


@router.get(
    "/v1/videos/{video_id}",
    response_model=VideoOut,
    dependencies=[Depends(require("read"))],
    responses=errors(404, 503),
)
def get_video(video_id: str, service: ServiceDep) -> Video:
    """One catalog record (hidden ones too, with ``hidden: true``)."""
    video = service.resources.catalog.get(_video_id(service, video_id))
    if video is None:
        raise NotFound(f"video_id: {video_id!r} is not in the catalog")
    return video


def _set_hidden(service: Service, video_id: str, hidden: bool) -> Video:
    video = service.resources.catalog.set_hidden(_video_id(service, video_id), hidden)
    service.reads.forget_videos([video_id])
    service.signals.index_videos([video])
    model = service.model
    if hidden and model is not None and model.retrieval is not None:
        # This process's index stops returning it at once; other processes' filters drop
        # it (it is hidden in the catalog) and the next version's export leaves it out.
        model.retrieval.index.remove([video.video_id])
    return video


@router.post(
    "/v1/videos/{video_id}/hide",
    response_model=VideoOut,
    dependencies=[Depends(require("admin"))],
    responses=errors(404, 503),
)
def hide_video(video_id: str, service: ServiceDep) -> Video:
    """Never recommend this video again (until unhidden); takes effect on the next request."""
    return _set_hidden(service, video_id, True)


@router.post(
    "/v1/videos/{video_id}/unhide",
    response_model=VideoOut,
    dependencies=[Depends(require("admin"))],
    responses=errors(404, 503),
)
def unhide_video(video_id: str, service: ServiceDep) -> Video:
    """Make a hidden video recommendable again."""
    return _set_hidden(service, video_id, False)
