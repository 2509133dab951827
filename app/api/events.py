"""``POST /v1/events``: a batch of user events into the event log."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.admission import EVENTS, deadline_of
from app.api.dependencies import RawBody, ServiceDep
from app.auth import require
from app.openapi import BATCH_REJECTED, errors
from app.schemas import BatchResult, EventBatch, ItemError
from app.service import Service
from feature_store.errors import EventLogUnavailable, InvalidInput, Overloaded, PayloadTooLarge
from feature_store.events import Event
from feature_store.json_keys import REPEATED_KEY, keys_in, repeated_keys

router = APIRouter(tags=["events"])


def item_id(raw: Any, key: str) -> str | None:
    """The item's id for error reports, when it has a short string one."""
    value = raw.get(key) if isinstance(raw, dict) else None
    return value if isinstance(value, str) and len(value) <= 1024 else None


UNKNOWN_RECOMMENDATION = (
    "not a recommendation_id this service issued: the event is kept without it "
    "(trained and counted, not attributed to a response)"
)


def repeated_item_keys(raw: bytes, list_name: str, items: list[Any]) -> dict[int, str]:
    """Items of a batch body naming a key twice: index -> the key's path within the item.
    A key repeated outside the items (``{"events": [], "events": [...]}``) refuses the
    whole request."""
    found: dict[int, str] = {}
    for path in repeated_keys(raw, 1 + keys_in(items)):
        head, _, rest = path.partition(".")
        index, _, field = rest.partition(".")
        if head != list_name or not index.isdigit() or not field:
            raise InvalidInput(path, REPEATED_KEY)
        found.setdefault(int(index), field)
    return found


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
def post_events(
    body: EventBatch, service: ServiceDep, raw: RawBody, request: Request
) -> BatchResult | JSONResponse:
    """Validate each event; write the valid ones to the event log; report the rest.

    Response: ``{"accepted": n, "rejected": m, "errors": [{"index", "id",
    "field", "message"}], "warnings": [...]}``. A ``recommendation_id`` this service
    never issued is dropped from its event, which is kept: a warning of the same shape
    says so (``field``: ``recommendation_id``). Status 200 when at least one event was accepted
    (the accepted ones are durable in the log when it returns), 422 when all
    were rejected, 413 over ``api.max_events_per_batch``.

    503 with ``Retry-After`` (seconds) when the event log is down or did not
    acknowledge within ``kafka.produce_timeout_ms``, and when the request's
    deadline (``api.ingest_deadline_ms``) passed first: answered by that
    deadline, at once while the broker is known to be down. 503 ``Overloaded``
    at once when ``api.max_concurrent_ingests`` posts are in flight already.
    Nothing was acknowledged, though some events may have been stored: resend
    the whole batch, with the same ``event_id``s, after ``Retry-After``; the
    trainer trains each ``event_id`` once (docs/deploy.md, *Faults*).

    An event naming a key twice is rejected like any invalid one (``field``: the key,
    ``message``: given twice): JSON parsers disagree on which value counts.
    """
    limit = service.resources.settings.api.max_events_per_batch
    if len(body.events) > limit:
        raise PayloadTooLarge(f"events: {len(body.events)} events, at most {limit} per batch")
    now_ms = int(time.time() * 1000)
    valid: list[Event] = []
    errors: list[ItemError] = []
    warnings: list[ItemError] = []
    repeated = repeated_item_keys(raw, "events", body.events)
    issued = service.recommender.ids.issued
    for index, item in enumerate(body.events):
        try:
            if index in repeated:
                raise InvalidInput(repeated[index], REPEATED_KEY)
            event = service.validator.parse_obj(item, now_ms)
        except InvalidInput as exc:
            errors.append(
                ItemError(
                    index=index, id=item_id(item, "event_id"), field=exc.field, message=exc.reason
                )
            )
            continue
        if event.recommendation_id is not None and not issued(event.recommendation_id):
            event = event.model_copy(update={"recommendation_id": None})
            warnings.append(ItemError(index=index, id=event.event_id, field="recommendation_id",
                                      message=UNKNOWN_RECOMMENDATION))
        valid.append(event)
    if warnings:
        count_unattributed(service, warnings)
    if valid:
        produce_within_deadline(service, valid, deadline_of(request.scope))
    service.metrics.events.labels("accepted").inc(len(valid))
    service.metrics.events.labels("rejected").inc(len(errors))
    result = BatchResult(
        accepted=len(valid), rejected=len(errors), errors=errors, warnings=warnings
    )
    return batch_response(result, "events")


def produce_within_deadline(service: Service, events: list[Event], deadline: float | None) -> None:
    """Write ``events`` and wait for the acknowledgement: at most ``kafka.produce_timeout_ms``,
    and no later than ``deadline`` (``time.monotonic()``; None: no deadline). Past the
    deadline, before or while waiting, 503 with ``Retry-After`` (shed, counted)."""
    settings = service.resources.settings
    budget_s = settings.kafka.produce_timeout_ms / 1000
    remaining_s = budget_s if deadline is None else deadline - time.monotonic()
    retry_after = settings.api.shed_retry_after_s
    if remaining_s <= 0:  # validation ate the deadline: the process is overloaded
        service.metrics.shed.labels(EVENTS, "deadline").inc()
        raise Overloaded(
            f"past its deadline ({settings.api.ingest_deadline_ms} ms) before the events "
            "were written; nothing was", retry_after_s=retry_after,
        )
    try:
        service.resources.event_log.produce(events, timeout_s=min(budget_s, remaining_s))
    except EventLogUnavailable:
        if deadline is not None and time.monotonic() >= deadline:  # the deadline ended it
            service.metrics.shed.labels(EVENTS, "deadline").inc()
        raise


def count_unattributed(service: Service, warnings: list[ItemError]) -> None:
    """Count and log (a summary line per interval) events whose ``recommendation_id`` this
    service never issued (:mod:`feature_store.recommendation_ids`). Their id was dropped:
    the trainer and the experiment feed would otherwise wait for a served record that does
    not exist, and count a lost join."""
    service.metrics.unknown_recommendation_ids.inc(len(warnings))
    service.log_summary.record(
        "events naming a recommendation_id this service never issued",
        f"{len(warnings)} in a batch, e.g. event {warnings[0].id} (kept without it)",
    )
