"""What both clients hold: where the service is, the key, retries, batch sizes, the buffer."""

from __future__ import annotations

from typing import TypedDict, Unpack

from app.client.operations import EventBuffer
from app.client.protocol import Retry

DEFAULT_BATCH = 500
"""Events or videos per request: half the service's default ``api.max_events_per_batch``."""
DEFAULT_RECOMMEND_BATCH = 100
"""Users per batch recommend: the service's default ``api.max_recommend_batch``."""


class ClientOptions(TypedDict, total=False):
    """What both clients take besides the service's URL (see :class:`ClientBase`)."""

    api_key: str | None
    timeout_s: float
    retry: Retry
    batch_size: int
    recommend_batch_size: int


class ClientBase:
    """Configuration shared by :class:`~app.client.sync.Client` and
    :class:`~app.client.aio.AsyncClient` (the I/O differs, nothing else)."""

    def __init__(self, base_url: str, **options: Unpack[ClientOptions]) -> None:
        """``api_key``: sent as ``X-API-Key`` (the write key for events and videos; reads
        need one only where ``api.read_key`` is set). ``timeout_s``: per try, seconds.
        ``batch_size``: events or videos per request, at most the service's
        ``api.max_events_per_batch`` / ``max_videos_per_batch``; also how many events
        :meth:`track` collects before it sends them."""
        api_key = options.get("api_key")
        self.base_url = base_url.rstrip("/")
        self.headers = {"X-API-Key": api_key} if api_key else {}
        self.timeout_s = options.get("timeout_s", 10.0)
        self.retry = options.get("retry") or Retry()
        self.batch_size = options.get("batch_size", DEFAULT_BATCH)
        self.recommend_batch_size = options.get("recommend_batch_size", DEFAULT_RECOMMEND_BATCH)
        if self.batch_size < 1 or self.recommend_batch_size < 1:
            raise ValueError("batch sizes must be at least 1")
        self.buffer = EventBuffer(self.batch_size)
        """Events handed to ``track`` and not sent yet (sent by ``flush`` and on close)."""
