"""Each API operation as a :data:`~app.client.protocol.Step` (the logic, once).

Events are sent in batches of ``batch_size`` (at most the service's
``api.max_events_per_batch``): :func:`send_events` splits what it is given,
and :class:`EventBuffer` collects events one at a time for :func:`track`,
sending a batch whenever one is full and the rest on :func:`flush`. An
event without an ``event_id`` gets a random one *before* its first try, so
every retry of its batch carries the same id (the service's idempotency
key); one without a ``ts`` gets the time it was handed over.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Required, TypedDict

from app.client.errors import ClientError
from app.client.protocol import Call, Retry, Step, api_error, send
from app.schemas import (
    BatchRecommendation,
    BatchRecommendResponse,
    BatchResult,
    ItemError,
    RecommendResponse,
    VideoOut,
)
from feature_store.catalog.base import Video
from feature_store.events import Event

EventIn = Event | Mapping[str, Any]
"""An event as :class:`~feature_store.events.Event`, or its JSON fields (``event_id`` and
``ts`` may be left out: the client fills them in)."""
VideoIn = Video | Mapping[str, Any]


class RecommendOptions(TypedDict, total=False):
    """``POST /v1/recommend``'s fields besides ``user_id`` (``RecommendRequest`` in
    ``/openapi.json``: the service checks them and answers a 422 naming the field)."""

    count: int
    candidates: Sequence[str]
    context: Mapping[str, Any]
    exclude_seen: bool
    exclude_served: bool | None
    filters: Mapping[str, Any]


class RecommendQuery(RecommendOptions, total=False):
    """One user's entry of a batch recommend."""

    user_id: Required[str]


def event_json(event: EventIn) -> dict[str, Any]:
    """The event's JSON body, with an ``event_id`` and a ``ts`` (ms) when it had none."""
    body = event.model_dump(mode="json") if isinstance(event, Event) else dict(event)
    body.setdefault("event_id", uuid.uuid4().hex)
    body.setdefault("ts", int(time.time() * 1000))
    return body


def video_json(video: VideoIn) -> dict[str, Any]:
    return video.model_dump(mode="json") if isinstance(video, Video) else dict(video)


def recommend(retry: Retry, user_id: str, options: RecommendOptions) -> Step[RecommendResponse]:
    response = yield from send(Call("POST", "/v1/recommend", {"user_id": user_id, **options}),
                               retry)
    return RecommendResponse.model_validate(response.json())


def recommend_batch(
    retry: Retry, queries: Sequence[RecommendQuery], batch_size: int
) -> Step[list[BatchRecommendation]]:
    """Answers in the order of ``queries``, sent ``batch_size`` users per request."""
    out: list[BatchRecommendation] = []
    for start in range(0, len(queries), batch_size):
        body = {"requests": [dict(q) for q in queries[start : start + batch_size]]}
        response = yield from send(Call("POST", "/v1/recommend/batch", body), retry)
        out += BatchRecommendResponse.model_validate(response.json()).results
    return out


def _batch_write(retry: Retry, method: str, path: str, key: str,
                 items: list[dict[str, Any]]) -> Step[BatchResult]:
    """One batch write: its result, also when every item was refused (a 422 listing them)."""
    response = yield from send(Call(method, path, {key: items}), retry, frozenset({200, 422}))
    body = response.json()
    if response.status_code == 422 and not body.get("errors"):
        raise api_error(response)  # the body itself was refused, not its items
    return BatchResult.model_validate(
        {k: body.get(k) for k in ("accepted", "rejected", "errors")}
        | {"warnings": body.get("warnings") or []}  # a service before warnings has none
    )


def merged(results: Sequence[tuple[int, BatchResult]]) -> BatchResult:
    """Batch results as one, each error's and warning's ``index`` counted from the first
    batch's start."""
    def shifted(pick: str) -> list[ItemError]:
        return [
            ItemError(index=offset + e.index, id=e.id, field=e.field, message=e.message)
            for offset, result in results for e in getattr(result, pick)
        ]

    return BatchResult(
        accepted=sum(r.accepted for _, r in results),
        rejected=sum(r.rejected for _, r in results),
        errors=shifted("errors"),
        warnings=shifted("warnings"),
    )


def send_events(retry: Retry, events: Sequence[EventIn], batch_size: int) -> Step[BatchResult]:
    bodies = [event_json(e) for e in events]  # ids fixed before any try
    results = []
    for start in range(0, len(bodies), batch_size):
        result = yield from _batch_write(
            retry, "POST", "/v1/events", "events", bodies[start : start + batch_size]
        )
        results.append((start, result))
    return merged(results)


def put_videos(retry: Retry, videos: Sequence[VideoIn], batch_size: int) -> Step[BatchResult]:
    bodies = [video_json(v) for v in videos]
    results = []
    for start in range(0, len(bodies), batch_size):
        result = yield from _batch_write(
            retry, "PUT", "/v1/videos", "videos", bodies[start : start + batch_size]
        )
        results.append((start, result))
    return merged(results)


def get_video(retry: Retry, video_id: str) -> Step[VideoOut]:
    response = yield from send(Call("GET", f"/v1/videos/{video_id}"), retry)
    return VideoOut.model_validate(response.json())


class EventBuffer:
    """Events handed to :func:`track`, waiting for a full batch or :func:`flush`.

    Safe to share between threads and tasks: its lock is held only while a
    batch is taken out or put back, never across a request.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._events)

    def add(self, event: EventIn) -> list[dict[str, Any]] | None:
        """Buffer ``event``; a full batch taken out when there is one."""
        body = event_json(event)
        with self._lock:
            self._events.append(body)
            if len(self._events) < self.batch_size:
                return None
            batch, self._events = self._events[: self.batch_size], self._events[self.batch_size :]
            return batch

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            batch, self._events = self._events, []
            return batch

    def put_back(self, events: list[dict[str, Any]]) -> None:
        """Events whose batch could not be delivered, first in line again (same ids)."""
        with self._lock:
            self._events[:0] = events


def deliver(retry: Retry, buffer: EventBuffer, events: list[dict[str, Any]]) -> Step[BatchResult]:
    """Send buffered ``events`` in batches; on failure they go back to the buffer."""
    results = []
    for start in range(0, len(events), buffer.batch_size):
        try:
            result = yield from _batch_write(
                retry, "POST", "/v1/events", "events", events[start : start + buffer.batch_size]
            )
        except ClientError:
            buffer.put_back(events[start:])
            raise
        results.append((start, result))
    return merged(results)


def track(retry: Retry, buffer: EventBuffer, event: EventIn) -> Step[BatchResult | None]:
    batch = buffer.add(event)
    if batch is None:
        return None
    return (yield from deliver(retry, buffer, batch))


def flush(retry: Retry, buffer: EventBuffer) -> Step[BatchResult]:
    return (yield from deliver(retry, buffer, buffer.take()))
