"""The catalog in Redis, shared by every API and trainer process.

Layout (prefixes from :mod:`feature_store.constants`):

- ``{CATALOG_VIDEO}{video_id}``: the video as JSON (the same JSON as a
  snapshot line), so ``get_many`` is one ``MGET``.
- ``CATALOG_IDS``: sorted set of the *visible* video ids scored by
  ``uploaded_at`` (ms); ``recent`` is one ``ZREVRANGEBYSCORE`` plus one ``MGET``
  and never has to skip hidden ones.
- ``CATALOG_HIDDEN``: sorted set of the hidden ids, same scores, so that
  ``count`` and ``iter_all`` still see every video without a ``SCAN``.

Every write of one video changes its JSON and its set membership in one
``MULTI``/``EXEC``, so a reader never sees a video in ``recent`` that its JSON
calls hidden, or the reverse.

On Redis Cluster (a :class:`~redis.cluster.RedisCluster` client) keys are not
hash-tagged, so they spread over the slots; multi-key commands and
transactions across slots are refused there, and this backend falls back to
per-key ``GET`` commands and ordered, non-transactional writes (JSON first, then
the sets): a reader may briefly see a video's old set membership, and
``set_hidden`` is last-writer-wins instead of ``WATCH``-guarded. ``restore``
is not supported on a cluster (its bulk ``DEL`` spans slots).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster

from feature_store.catalog.base import Video
from feature_store.catalog.memory import read_snapshot, write_snapshot
from feature_store.constants import CATALOG_HIDDEN, CATALOG_IDS, CATALOG_VIDEO
from feature_store.errors import NotFound, StoreUnavailable
from feature_store.redis_errors import redis_errors

if TYPE_CHECKING:
    from feature_store.sparse.steps import Steps

"""Sorted set of hidden video ids scored by ``uploaded_at``.

Derived from ``CATALOG_IDS`` so it follows its layout version; belongs in
:mod:`feature_store.constants` next to it.
"""


def store_errors(operation: str) -> AbstractContextManager[None]:
    """Redis failures as :class:`StoreUnavailable` (:mod:`feature_store.redis_errors`).

    ``operation`` names the store and method in the message (``"catalog
    get_many"``); shared with the activity store's Redis backend.
    """
    return redis_errors(StoreUnavailable, f"{operation} failed")


def _text(value: Any) -> str:
    """Member names come back as bytes unless the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RedisCatalog:
    """Catalog in Redis; see the module docstring for the layout.

    ``client``: a redis-py client owned by the caller (closed by whoever
    opened it, not by :meth:`close`). ``chunk``: most keys per command, so one
    reply stays bounded (``RedisSettings.batch_chunk``); a larger request is
    still one round trip, as several commands in one pipeline.
    """

    def __init__(self, client: redis.Redis, chunk: int = 8192) -> None:
        self.client = client
        self.chunk = chunk
        self._atomic = not isinstance(client, RedisCluster)
        """False on Redis Cluster: a video's JSON and its set membership live in
        different slots, so they are written in order (JSON first) but not in
        one transaction; a reader may briefly see a stale membership."""

    def __enter__(self) -> RedisCatalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- writes ------------------------------------------------------------

    def upsert(self, videos: Sequence[Video]) -> None:
        """Insert or replace videos: one pipelined transaction per ``chunk`` videos."""
        with store_errors("catalog upsert"):
            for part in _chunks(videos, self.chunk):
                pipe = self.client.pipeline(transaction=self._atomic)
                for video in part:
                    _queue_write(pipe, video)
                pipe.execute()

    def set_hidden(self, video_id: str, hidden: bool) -> Video:
        """Hide or unhide; raises :class:`NotFound` for an unknown id.

        Optimistic: ``WATCH`` the video's key, so a concurrent upsert of the
        same video makes this retry instead of being overwritten by stale JSON.
        """
        key = CATALOG_VIDEO + video_id
        result: list[Video] = []

        def change(pipe: Any) -> None:
            raw = pipe.get(key)
            if raw is None:
                raise NotFound(f"video {video_id!r} is not in the catalog")
            video = Video.model_validate_json(raw).model_copy(update={"hidden": hidden})
            pipe.multi()
            _queue_write(pipe, video)
            result[:] = [video]

        with store_errors("catalog set_hidden"):
            if self._atomic:
                self.client.transaction(change, key)
                return result[0]
            raw = self.client.get(key)  # Redis Cluster: no WATCH across slots; last writer wins
            if raw is None:
                raise NotFound(f"video {video_id!r} is not in the catalog")
            video = Video.model_validate_json(raw).model_copy(update={"hidden": hidden})
            self.upsert([video])
        return video

    # --- reads -------------------------------------------------------------

    def get(self, video_id: str) -> Video | None:
        with store_errors("catalog get"):
            raw = self.client.get(CATALOG_VIDEO + video_id)
        return None if raw is None else Video.model_validate_json(raw)

    def get_many(self, video_ids: Sequence[str]) -> list[Video | None]:
        """Videos in the order asked, ``None`` where unknown; one round trip."""
        if not video_ids:
            return []
        with store_errors("catalog get_many"):
            pipe = self.client.pipeline(transaction=False)
            if self._atomic:
                for part in _chunks(video_ids, self.chunk):
                    pipe.mget([CATALOG_VIDEO + video_id for video_id in part])
            else:  # Redis Cluster: MGET needs one slot; GETs, pipelined per node
                for video_id in video_ids:
                    pipe.get(CATALOG_VIDEO + video_id)
            replies = pipe.execute()
            if not self._atomic:
                replies = [replies]
        return [
            None if raw is None else Video.model_validate_json(raw)
            for reply in replies
            for raw in reply
        ]

    def recent(self, limit: int, since_ms: int | None = None) -> list[Video]:
        """Newest visible uploads first; only those uploaded at or after ``since_ms``.

        Two round trips (ids, then their JSON). A video hidden between the two
        is dropped, so the answer may hold fewer than ``limit`` then.
        """
        if limit <= 0:
            return []
        low: str | int = "-inf" if since_ms is None else since_ms
        with store_errors("catalog recent"):
            ids = self.client.zrevrangebyscore(CATALOG_IDS, "+inf", low, start=0, num=limit)
        found = self.get_many([_text(member) for member in ids])
        return [video for video in found if video is not None and not video.hidden]

    def recent_steps(self, limit: int, since_ms: int | None = None) -> Steps[list[Video]]:
        """:meth:`recent` as steps (:mod:`feature_store.sparse.steps`): its two round trips
        ride in those of the request's other reads (a cluster's: at once)."""
        # Imported here: feature_store.sparse's package imports the features, whose columns
        # import the activity store, which imports this catalog.
        from feature_store.sparse.resp import command_steps

        if limit <= 0 or not self._atomic:
            return self.recent(limit, since_ms)
        low: str | int = "-inf" if since_ms is None else since_ms
        (ids,) = yield from command_steps(
            self.client, [("ZREVRANGEBYSCORE", CATALOG_IDS, "+inf", low, "LIMIT", 0, limit)],
            StoreUnavailable, "catalog recent failed",
        )
        if not ids:
            return []
        (raws,) = yield from command_steps(
            self.client, [("MGET", *(CATALOG_VIDEO + _text(member) for member in ids))],
            StoreUnavailable, "catalog recent failed",
        )
        found = [None if raw is None else Video.model_validate_json(raw) for raw in raws]
        return [video for video in found if video is not None and not video.hidden]

    def count(self) -> int:
        """Every video, hidden ones included."""
        with store_errors("catalog count"):
            pipe = self.client.pipeline(transaction=self._atomic)
            pipe.zcard(CATALOG_IDS)
            pipe.zcard(CATALOG_HIDDEN)
            visible, hidden = pipe.execute()
        return int(visible) + int(hidden)

    def iter_all(self) -> Iterable[Video]:
        """Every video, hidden included, ``chunk`` at a time (not a point-in-time view)."""
        for ids in self._iter_ids():
            for video in self.get_many(ids):
                if video is not None:
                    yield video

    def _iter_ids(self) -> Iterator[list[str]]:
        """All ids of both sets, one chunk at a time, by rank.

        Ranks shift under concurrent writes, so a video written meanwhile may
        be missed or seen twice; snapshots are taken from a quiet catalog.
        """
        for key in (CATALOG_IDS, CATALOG_HIDDEN):
            start = 0
            while True:
                with store_errors("catalog iter_all"):
                    members = self.client.zrange(key, start, start + self.chunk - 1)
                if not members:
                    break
                yield [_text(member) for member in members]
                start += len(members)

    # --- persistence -------------------------------------------------------

    def snapshot(self, directory: Path) -> None:
        """Write every video to ``directory`` in the shared JSON-lines format."""
        write_snapshot(directory, self.iter_all())

    def restore(self, directory: Path) -> int:
        """Make the catalog equal to a snapshot from any backend; returns its size.

        Writes every snapshot video first, then deletes the videos the
        snapshot lacks, so a video present in both is never missing to
        readers meanwhile. Not one transaction: readers may see a mix of old
        and new records while it runs.
        """
        kept: set[str] = set()
        batch: list[Video] = []
        for video in read_snapshot(directory):
            kept.add(video.video_id)
            batch.append(video)
            if len(batch) >= self.chunk:
                self.upsert(batch)
                batch = []
        self.upsert(batch)
        stale = [video_id for ids in self._iter_ids() for video_id in ids if video_id not in kept]
        with store_errors("catalog restore"):
            for part in _chunks(stale, self.chunk):
                pipe = self.client.pipeline(transaction=True)
                pipe.delete(*(CATALOG_VIDEO + video_id for video_id in part))
                pipe.zrem(CATALOG_IDS, *part)
                pipe.zrem(CATALOG_HIDDEN, *part)
                pipe.execute()
        return len(kept)

    def close(self) -> None:
        """Nothing to release: the client belongs to whoever opened it."""


def _queue_write(pipe: Any, video: Video) -> None:
    """Queue the commands that store ``video`` and put it in the right set."""
    pipe.set(CATALOG_VIDEO + video.video_id, video.model_dump_json())
    shown, other = (CATALOG_HIDDEN, CATALOG_IDS) if video.hidden else (CATALOG_IDS, CATALOG_HIDDEN)
    pipe.zadd(shown, {video.video_id: video.uploaded_at})
    pipe.zrem(other, video.video_id)
