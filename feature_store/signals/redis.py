"""Candidate signals in Redis, shared by every serving and training process.

Layout (keys in :mod:`feature_store.constants`): one sorted set for trending
(plus its landmark), one sorted set of partners per video, one sorted set of
uploads per creator, one hash of each video's category and one trending
sorted set per category (plus the set of those categories). Writes are
pipelined per batch (category trending first reads the batch's categories:
one more round trip), reads are one pipelined round trip. Increments are
commutative (``ZINCRBY``), so several trainers may record concurrently; the
rare rescale of the trending scores runs as a ``WATCH``/``MULTI`` transaction
on the landmark so that it happens once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from feature_store.activity.base import HistoryEntry
from feature_store.catalog.base import Video
from feature_store.constants import (
    CATEGORIES,
    CATEGORY_OF,
    CATEGORY_TRENDING,
    COVISIT,
    COVISIT_VISITS,
    CREATOR_VIDEOS,
    TRENDING,
    TRENDING_LANDMARK,
)
from feature_store.errors import StoreUnavailable
from feature_store.events import Event
from feature_store.redis_errors import redis_errors
from feature_store.signals.base import (
    RESCALE_EXPONENT,
    SignalParams,
    cosine_scores,
    covisit_increments,
    interleave,
    seed_weights,
    trending_increments,
)
from feature_store.sparse.resp import command_steps, score_pairs
from feature_store.sparse.steps import Steps

PAIR_TTL_S = 30 * 24 * 3600
"""Seconds a video's partner list lives after its last update."""


def signal_errors(operation: str) -> AbstractContextManager[None]:
    """Redis failures as :class:`StoreUnavailable` (:mod:`feature_store.redis_errors`)."""
    return redis_errors(StoreUnavailable, f"signals {operation} failed")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _partners(
    seeds: Mapping[str, float], rows: Sequence[Sequence[Any]]
) -> dict[str, dict[str, float]]:
    """Each seed's partner counts from its ``ZREVRANGE ... WITHSCORES`` reply."""
    return {
        seed: {_text(other): float(count) for other, count in row}
        for seed, row in zip(seeds, rows, strict=True)
    }


def _cosine(
    partners: dict[str, dict[str, float]], seeds: dict[str, float], fields: list[str],
    counts: Sequence[Any], limit: int | None,
) -> list[tuple[str, float]]:
    """:func:`~feature_store.signals.base.cosine_scores` with ``fields``' visits as
    ``HMGET`` returned them (None: never counted)."""
    visits = {video: float(n) for video, n in zip(fields, counts, strict=True) if n}
    return cosine_scores(partners, seeds, visits, limit)


def _visit_fields(
    seeds: Mapping[str, float], partners: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """The videos whose visits a cosine needs: the seeds, then every partner, once each."""
    fields = dict.fromkeys(seeds)
    for row in partners.values():
        fields.update(dict.fromkeys(row))
    return list(fields)


class RedisSignals:
    """:class:`~feature_store.signals.base.CandidateSignals` in Redis (client is the caller's)."""

    def __init__(self, client: redis.Redis, params: SignalParams) -> None:
        self.client = client
        self.params = params

    def _landmark(self, first_ts: int) -> int:
        self.client.set(TRENDING_LANDMARK, first_ts, nx=True)
        return int(self.client.get(TRENDING_LANDMARK) or first_ts)

    def record(
        self,
        events: Sequence[Event],
        histories: Mapping[str, Sequence[HistoryEntry]] | None = None,
    ) -> None:
        if not events:
            return
        covisits = covisit_increments(events, histories, self.params.window)
        with signal_errors("record"):
            landmark = self._landmark(min(e.ts for e in events))
            landmark = self._maybe_rescale(landmark, max(e.ts for e in events))
            increments = trending_increments(events, landmark, self.params.half_life_s)
            videos = list(increments)
            categories = self.client.hmget(CATEGORY_OF, videos) if videos else []
            pipe = self.client.pipeline(transaction=False)
            touched_categories: set[str] = set()
            for video, category in zip(videos, categories, strict=True):
                pipe.zincrby(TRENDING, increments[video], video)
                if category is not None:
                    key = CATEGORY_TRENDING + _text(category)
                    pipe.zincrby(key, increments[video], video)
                    touched_categories.add(key)
            for key in touched_categories:
                pipe.zremrangebyrank(key, 0, -(self.params.category_videos + 1))
            if touched_categories:
                pipe.sadd(CATEGORIES, *touched_categories)
            for video, count in covisits.visits.items():
                pipe.hincrbyfloat(COVISIT_VISITS, video, count)
            touched: set[str] = set()
            for (a, b), weight in covisits.pairs.items():
                pipe.zincrby(COVISIT + a, weight, b)
                touched.add(a)
            for video in touched:
                pipe.zremrangebyrank(COVISIT + video, 0, -(self.params.neighbors + 1))
                pipe.expire(COVISIT + video, PAIR_TTL_S)
            pipe.execute()

    def _maybe_rescale(self, landmark: int, ts_ms: int) -> int:
        half_life_ms = self.params.half_life_s * 1000.0
        exponent = (ts_ms - landmark) / half_life_ms
        if exponent <= RESCALE_EXPONENT:
            return landmark
        shift = int(exponent)
        new_landmark = landmark + int(shift * half_life_ms)
        if isinstance(self.client, RedisCluster):
            return self._rescale_on_cluster(landmark, new_landmark, shift)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(TRENDING_LANDMARK)
                if int(pipe.get(TRENDING_LANDMARK) or landmark) != landmark:
                    pipe.unwatch()
                    return int(self.client.get(TRENDING_LANDMARK) or landmark)
                keys = [_text(k) for k in self.client.smembers(CATEGORIES)]
                pipe.multi()
                for key in (TRENDING, *keys):
                    pipe.zunionstore(key, {key: 2.0**-shift})
                pipe.set(TRENDING_LANDMARK, new_landmark)
                pipe.execute()
            except redis.WatchError:
                return int(self.client.get(TRENDING_LANDMARK) or landmark)
        return new_landmark

    def _rescale_on_cluster(self, landmark: int, new_landmark: int, shift: int) -> int:
        """Redis Cluster: the scores and the landmark live in two slots, so no
        ``WATCH``/``MULTI``; whoever moves the landmark first (``SET`` with
        compare by ``GETSET``) rescales. Two trainers racing within one batch
        may both see the old landmark; the second then finds it moved and
        skips. Between the two writes a reader sees rescaled scores under the
        old landmark for one round trip (trending's order is unaffected)."""
        previous = self.client.getset(TRENDING_LANDMARK, new_landmark)
        if previous is not None and int(previous) != landmark:
            self.client.set(TRENDING_LANDMARK, previous)  # someone else moved it: put it back
            return int(previous)
        for key in (TRENDING, *(_text(k) for k in self.client.smembers(CATEGORIES))):
            self.client.zunionstore(key, {key: 2.0**-shift})
        return new_landmark

    def index_videos(self, videos: Sequence[Video]) -> None:
        if not videos:
            return
        with signal_errors("index_videos"):
            ids = [video.video_id for video in videos]
            before = self.client.hmget(CATEGORY_OF, ids)
            pipe = self.client.pipeline(transaction=False)
            creators: set[str] = set()
            for video, old in zip(videos, before, strict=True):
                key = CREATOR_VIDEOS + video.creator_id
                if old is not None and (video.hidden or _text(old) != video.category):
                    pipe.zrem(CATEGORY_TRENDING + _text(old), video.video_id)
                if video.hidden:
                    pipe.zrem(key, video.video_id)
                    pipe.hdel(CATEGORY_OF, video.video_id)
                else:
                    pipe.zadd(key, {video.video_id: video.uploaded_at})
                    pipe.hset(CATEGORY_OF, video.video_id, video.category)
                    creators.add(key)
            for key in creators:
                pipe.zremrangebyrank(key, 0, -(self.params.creator_videos + 1))
            pipe.execute()

    def trending(self, limit: int) -> list[tuple[str, float]]:
        with signal_errors("trending"):
            rows: list[Any] = self.client.zrevrange(TRENDING, 0, limit - 1, withscores=True)
        if not rows:
            return []
        top = float(rows[0][1]) or 1.0
        return [(_text(video), float(score) / top) for video, score in rows]

    def trending_steps(self, limit: int) -> Steps[list[tuple[str, float]]]:
        """:meth:`trending` as steps (its read shares the request's round trips)."""
        if isinstance(self.client, RedisCluster):
            return self.trending(limit)
        (reply,) = yield from command_steps(
            self.client, [("ZREVRANGE", TRENDING, 0, limit - 1, "WITHSCORES")],
            StoreUnavailable, "signals trending failed",
        )
        rows = score_pairs(reply)
        if not rows:
            return []
        top = rows[0][1] or 1.0
        return [(_text(video), score / top) for video, score in rows]

    def covisited(
        self, video_ids: Sequence[str], limit: int | None
    ) -> list[tuple[str, float]]:
        seeds = seed_weights(video_ids, self.params.decay)
        if not seeds:
            return []
        with signal_errors("covisited"):
            pipe = self.client.pipeline(transaction=False)
            for video in seeds:
                pipe.zrevrange(COVISIT + video, 0, -1, withscores=True)
            rows = pipe.execute()
            partners = _partners(seeds, rows)
            fields = _visit_fields(seeds, partners)
            counts = self.client.hmget(COVISIT_VISITS, fields)
        return _cosine(partners, seeds, fields, counts, limit)

    def covisited_steps(
        self, video_ids: Sequence[str], limit: int | None
    ) -> Steps[list[tuple[str, float]]]:
        """:meth:`covisited` as steps (:mod:`feature_store.sparse.steps`): its first round
        trip (the seeds' partners) shares one with the request's other reads (a cluster's:
        at once); the second reads the visits of the videos found."""
        seeds = seed_weights(video_ids, self.params.decay)
        if not seeds or isinstance(self.client, RedisCluster):
            return self.covisited(video_ids, limit)
        replies = yield from command_steps(
            self.client, [("ZREVRANGE", COVISIT + video, 0, -1, "WITHSCORES") for video in seeds],
            StoreUnavailable, "signals covisited failed",
        )
        partners = _partners(seeds, [score_pairs(reply) for reply in replies])
        fields = _visit_fields(seeds, partners)
        (counts,) = yield from command_steps(
            self.client, [("HMGET", COVISIT_VISITS, *fields)],
            StoreUnavailable, "signals covisited failed",
        )
        return _cosine(partners, seeds, fields, counts, limit)

    def creator_videos(self, creator_ids: Sequence[str], limit: int) -> list[str]:
        return self._interleaved_tops("creator_videos", CREATOR_VIDEOS, creator_ids, limit)

    def category_videos(self, categories: Sequence[str], limit: int) -> list[str]:
        return self._interleaved_tops("category_videos", CATEGORY_TRENDING, categories, limit)

    def creator_videos_steps(self, creator_ids: Sequence[str], limit: int) -> Steps[list[str]]:
        """:meth:`creator_videos` as steps (its read shares the request's round trips)."""
        return self._interleaved_tops_steps("creator_videos", CREATOR_VIDEOS, creator_ids, limit)

    def category_videos_steps(self, categories: Sequence[str], limit: int) -> Steps[list[str]]:
        """:meth:`category_videos` as steps (its read shares the request's round trips)."""
        return self._interleaved_tops_steps(
            "category_videos", CATEGORY_TRENDING, categories, limit
        )

    def _interleaved_tops_steps(
        self, what: str, prefix: str, names: Sequence[str], limit: int
    ) -> Steps[list[str]]:
        if not names or isinstance(self.client, RedisCluster):
            return self._interleaved_tops(what, prefix, names, limit)
        commands = [("ZREVRANGE", prefix + name, 0, limit - 1) for name in names]
        replies = yield from command_steps(
            self.client, commands, StoreUnavailable, f"signals {what} failed"
        )
        return interleave([[_text(v) for v in rows] for rows in replies], limit)

    def _interleaved_tops(
        self, what: str, prefix: str, names: Sequence[str], limit: int
    ) -> list[str]:
        """The top ``limit`` of each sorted set ``prefix + name``, interleaved, in one trip."""
        if not names:
            return []
        with signal_errors(what):
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.zrevrange(prefix + name, 0, limit - 1)
            replies = pipe.execute()
        return interleave([[_text(v) for v in rows] for rows in replies], limit)

    def ping(self) -> None:
        with signal_errors("ping"):
            self.client.ping()

    def snapshot(self, directory: Path) -> None:
        """Redis persists itself; nothing to write."""

    def restore(self, directory: Path) -> None:
        """Redis persists itself; nothing to read."""

    def close(self) -> None:
        """The client is the caller's; nothing to close."""
