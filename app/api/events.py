"""``POST /v1/events``: a batch of user events into the event log."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.api.dependencies import ServiceDep
from app.auth import require
from app.openapi import BATCH_REJECTED, errors
from app.schemas import BatchResult, EventBatch, ItemError
from feature_store.errors import InvalidInput, PayloadTooLarge
from feature_store.events import Event

router = APIRouter(tags=["events"])


def item_id(raw: Any, key: str) -> str | None:
    """The item's id for error reports, when it has a short string one."""
    value = raw.get(key) if isinstance(raw, dict) else None
    return value if isinstance(value, str) and len(value) <= 1024 else None


def batch_response(result: BatchResult, list_name: str) -> BatchResult | JSONResponse:
    """200 with the result when something was kept; 422 naming the first bad field if not."""
    if result.accepted or not result.errors:
        return result
    first = result.errors[0]
    body = {
        "error": "InvalidInput",
        "field": f"{list_name}.{first.index}.{first.field}",
        "message": f"every item was rejected; first: {first.message}",
        **result.model_dump(),
    }
    return JSONResponse(body, status_code=422)


@router.post(
    "/v1/events",
    response_model=BatchResult,
    dependencies=[Depends(require("write"))],
    responses={**errors(503), 422: BATCH_REJECTED},
)
def post_events(body: EventBatch, service: ServiceDep) -> BatchResult | JSONResponse:
    """Validate each event; write the valid ones to the event log; report the rest.

    Response: ``{"accepted": n, "rejected": m, "errors": [{"index", "id",
    "field", "message"}]}``. Status 200 when at least one event was accepted
    (the accepted ones are durable in the log when it returns), 422 when all
    were rejected, 413 over ``api.max_events_per_batch``.

    503 with ``Retry-After`` (seconds) when the event log is down or did not
    acknowledge within ``kafka.produce_timeout_ms``: answered within about a
    second, at once while the broker is known to be down. Nothing was
    acknowledged, though some events may have been stored: resend the whole
    batch, with the same ``event_id``s, after ``Retry-After``; the trainer
    trains each ``event_id`` once (docs/deploy.md, *Faults*).
    """
    limit = service.resources.settings.api.max_events_per_batch
    if len(body.events) > limit:
        raise PayloadTooLarge(f"events: {len(body.events)} events, at most {limit} per batch")
    now_ms = int(time.time() * 1000)
    valid: list[Event] = []
    errors: list[ItemError] = []
    for index, raw in enumerate(body.events):
        try:
            valid.append(service.validator.parse_obj(raw, now_ms))
        except InvalidInput as exc:
            errors.append(
                ItemError(
                    index=index, id=item_id(raw, "event_id"), field=exc.field, message=exc.reason
                )
            )
    if valid:
        timeout_s = service.resources.settings.kafka.produce_timeout_ms / 1000
        service.resources.event_log.produce(valid, timeout_s=timeout_s)
    service.metrics.events.labels("accepted").inc(len(valid))
    service.metrics.events.labels("rejected").inc(len(errors))
    result = BatchResult(accepted=len(valid), rejected=len(errors), errors=errors)
    return batch_response(result, "events")
