"""The blocking client: drives :mod:`app.client.operations` with ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import httpx

from app.client import operations as ops
from app.client.base import ClientBase, ClientOptions
from app.client.protocol import Step, Wait
from app.schemas import BatchRecommendation, BatchResult, RecommendResponse, VideoOut

T = TypeVar("T")


class Client(ClientBase):
    """vidrec's HTTP API from blocking code. A context manager: leaving it sends the
    events still buffered by :meth:`track` and closes the connections.

    >>> with Client("http://127.0.0.1:8000", api_key="...") as vidrec:
    ...     page = vidrec.recommend("u1", count=10)
    ...     vidrec.track({"user_id": "u1", "video_id": page.items[0].video_id,
    ...                   "type": "impression", "recommendation_id": page.recommendation_id})
    """

    def __init__(self, base_url: str, *, transport: httpx.BaseTransport | None = None,
                 **options: Unpack[ClientOptions]) -> None:
        super().__init__(base_url, **options)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers,
                                  timeout=self.timeout_s, transport=transport)

    def _run(self, step: Step[T]) -> T:
        """Drive ``step``: send its calls, sleep its waits, hand back answers (or errors)."""
        answer: httpx.Response | None = None
        error: httpx.TransportError | None = None
        while True:
            try:
                todo = step.throw(error) if error is not None else step.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            answer, error = None, None
            if isinstance(todo, Wait):
                time.sleep(todo.seconds)
                continue
            try:
                answer = self._http.request(todo.method, todo.path, json=todo.json)
            except httpx.TransportError as exc:
                error = exc

    def recommend(self, user_id: str, **options: Unpack[ops.RecommendOptions]
                  ) -> RecommendResponse:
        """``POST /v1/recommend``: items in the ranking order (not ``score`` order)."""
        return self._run(ops.recommend(self.retry, user_id, options))

    def recommend_batch(self, queries: Sequence[ops.RecommendQuery]
                        ) -> list[BatchRecommendation]:
        """``POST /v1/recommend/batch``, ``recommend_batch_size`` users per request."""
        return self._run(ops.recommend_batch(self.retry, queries, self.recommend_batch_size))

    def send_events(self, events: Sequence[ops.EventIn]) -> BatchResult:
        """``POST /v1/events`` now, in batches; the rejected ones listed with their field."""
        return self._run(ops.send_events(self.retry, events, self.batch_size))

    def track(self, event: ops.EventIn) -> BatchResult | None:
        """Buffer ``event``; sends a batch once ``batch_size`` are waiting (its result)."""
        return self._run(ops.track(self.retry, self.buffer, event))

    def flush(self) -> BatchResult:
        """Send every buffered event now (on failure they stay buffered, same ids)."""
        return self._run(ops.flush(self.retry, self.buffer))

    def put_videos(self, videos: Sequence[ops.VideoIn]) -> BatchResult:
        """``PUT /v1/videos`` (create or update), in batches."""
        return self._run(ops.put_videos(self.retry, videos, self.batch_size))

    def get_video(self, video_id: str) -> VideoOut:
        return self._run(ops.get_video(self.retry, video_id))

    def close(self) -> None:
        """Send the buffered events, then close the connections (even if sending failed)."""
        try:
            if len(self.buffer):
                self.flush()
        finally:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
