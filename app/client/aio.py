"""The asyncio client: drives :mod:`app.client.operations` with ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import httpx

from app.client import operations as ops
from app.client.base import ClientBase, ClientOptions
from app.client.protocol import Step, Wait
from app.schemas import BatchRecommendation, BatchResult, RecommendResponse, VideoOut

T = TypeVar("T")


class AsyncClient(ClientBase):
    """vidrec's HTTP API from asyncio code: :class:`~app.client.sync.Client`'s methods,
    awaited. ``async with`` sends the events still buffered by :meth:`track` on exit."""

    def __init__(self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 **options: Unpack[ClientOptions]) -> None:
        super().__init__(base_url, **options)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                       timeout=self.timeout_s, transport=transport)

    async def _run(self, step: Step[T]) -> T:
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
                await asyncio.sleep(todo.seconds)
                continue
            try:
                answer = await self._http.request(todo.method, todo.path, json=todo.json)
            except httpx.TransportError as exc:
                error = exc

    async def recommend(self, user_id: str, **options: Unpack[ops.RecommendOptions]
                        ) -> RecommendResponse:
        return await self._run(ops.recommend(self.retry, user_id, options))

    async def recommend_batch(self, queries: Sequence[ops.RecommendQuery]
                              ) -> list[BatchRecommendation]:
        return await self._run(
            ops.recommend_batch(self.retry, queries, self.recommend_batch_size))

    async def send_events(self, events: Sequence[ops.EventIn]) -> BatchResult:
        return await self._run(ops.send_events(self.retry, events, self.batch_size))

    async def track(self, event: ops.EventIn) -> BatchResult | None:
        return await self._run(ops.track(self.retry, self.buffer, event))

    async def flush(self) -> BatchResult:
        return await self._run(ops.flush(self.retry, self.buffer))

    async def put_videos(self, videos: Sequence[ops.VideoIn]) -> BatchResult:
        return await self._run(ops.put_videos(self.retry, videos, self.batch_size))

    async def get_video(self, video_id: str) -> VideoOut:
        return await self._run(ops.get_video(self.retry, video_id))

    async def aclose(self) -> None:
        try:
            if len(self.buffer):
                await self.flush()
        finally:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
