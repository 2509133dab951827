"""Per-user feedback in Redis, shared by every serving process.

Layout (keys in :mod:`feature_store.constants`): per user, one sorted set of
served-without-engagement videos scored by served time, one of disliked
videos and one of their creators, scored by the dislike's time. Each write
is one pipeline: ``ZADD GT`` (a replayed, older record never moves a time
back), trims by time and by rank to the bounds, and an expiry (the served
window, or ``dislikes_ttl_ms``, from the last write: wall clock, so a user
who stops coming costs nothing after it). A read is one pipelined round trip.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from feature_store.constants import (
    FEEDBACK_DISLIKED,
    FEEDBACK_DISLIKED_CREATORS,
    FEEDBACK_SERVED,
)
from feature_store.errors import StoreUnavailable
from feature_store.events import Event
from feature_store.signals.feedback.base import (
    DISLIKE,
    ENGAGEMENTS,
    FeedbackParams,
    FeedbackView,
    ServedBatch,
    creator_changes,
)
from feature_store.signals.redis import signal_errors
from feature_store.sparse.resp import command_steps, score_pairs
from feature_store.sparse.steps import Steps


def _stamps(rows: list[Any]) -> dict[str, int]:
    return {
        (member.decode() if isinstance(member, bytes) else member): int(score)
        for member, score in rows
    }


class RedisFeedback:
    """:class:`~feature_store.signals.feedback.base.UserFeedback` in Redis (the client is
    the caller's)."""

    def __init__(self, client: redis.Redis, params: FeedbackParams) -> None:
        self.client = client
        self.params = params

    def record_served(self, batches: Sequence[ServedBatch]) -> None:
        if not batches:
            return
        p = self.params
        with signal_errors("record_served"):
            pipe = self.client.pipeline(transaction=False)
            for user_id, ts_ms, video_ids in batches:
                if not video_ids:
                    continue
                key = FEEDBACK_SERVED + user_id
                pipe.zadd(key, dict.fromkeys(video_ids, ts_ms), gt=True)
                pipe.zremrangebyscore(key, "-inf", f"({ts_ms - p.served_window_ms}")
                pipe.zremrangebyrank(key, 0, -(p.served_max + 1))
                pipe.pexpire(key, p.served_window_ms)
            pipe.execute()

    def record_events(self, events: Sequence[Event], creators: Mapping[str, str]) -> None:
        cleared: dict[str, set[str]] = defaultdict(set)
        disliked: dict[str, dict[str, int]] = defaultdict(dict)
        for event in events:
            if event.type in ENGAGEMENTS:
                cleared[event.user_id].add(event.video_id)
            elif event.type is DISLIKE:
                stamps = disliked[event.user_id]
                stamps[event.video_id] = max(stamps.get(event.video_id, 0), event.ts)
        disliked_creators, forgiven = creator_changes(
            events, creators, self.params.positive_watch_ratio
        )
        if not (cleared or disliked or forgiven):
            return
        p = self.params
        with signal_errors("record_events"):
            pipe = self.client.pipeline(transaction=False)
            for user_id, videos in cleared.items():
                pipe.zrem(FEEDBACK_SERVED + user_id, *videos)
            for user_id, gone in forgiven.items():
                if gone:
                    pipe.zrem(FEEDBACK_DISLIKED_CREATORS + user_id, *gone)
            for prefix, table in (
                (FEEDBACK_DISLIKED, disliked),
                (FEEDBACK_DISLIKED_CREATORS, disliked_creators),
            ):
                for user_id, stamps in table.items():
                    key = prefix + user_id
                    pipe.zadd(key, stamps, gt=True)  # type: ignore[arg-type]
                    pipe.zremrangebyrank(key, 0, -(p.dislikes_max + 1))
                    pipe.pexpire(key, p.dislikes_ttl_ms)
            pipe.execute()

    def read(self, user_id: str, now_ms: int) -> FeedbackView:
        oldest = now_ms - self.params.served_window_ms
        with signal_errors("read feedback"):
            pipe = self.client.pipeline(transaction=False)
            pipe.zrangebyscore(FEEDBACK_SERVED + user_id, oldest, "+inf", withscores=True)
            pipe.zrange(FEEDBACK_DISLIKED + user_id, 0, -1, withscores=True)
            pipe.zrange(FEEDBACK_DISLIKED_CREATORS + user_id, 0, -1, withscores=True)
            served, disliked, creators = pipe.execute()
        return FeedbackView(_stamps(served), _stamps(disliked), _stamps(creators))

    def read_steps(self, user_id: str, now_ms: int) -> Steps[FeedbackView]:
        """:meth:`read` as steps (:mod:`feature_store.sparse.steps`), to be read in the same
        round trip as other stores' reads (a cluster's: at once)."""
        if isinstance(self.client, RedisCluster):
            return self.read(user_id, now_ms)
        oldest = now_ms - self.params.served_window_ms
        commands = [
            ("ZRANGEBYSCORE", FEEDBACK_SERVED + user_id, oldest, "+inf", "WITHSCORES"),
            ("ZRANGE", FEEDBACK_DISLIKED + user_id, 0, -1, "WITHSCORES"),
            ("ZRANGE", FEEDBACK_DISLIKED_CREATORS + user_id, 0, -1, "WITHSCORES"),
        ]
        replies = yield from command_steps(
            self.client, commands, StoreUnavailable, "signals read feedback failed"
        )
        served, disliked, creators = (score_pairs(reply) for reply in replies)
        return FeedbackView(_stamps(served), _stamps(disliked), _stamps(creators))

    def ping(self) -> None:
        with signal_errors("ping"):
            self.client.ping()

    def snapshot(self, directory: Path) -> None:
        """Redis persists itself; nothing to write."""

    def restore(self, directory: Path) -> None:
        """Redis persists itself; nothing to read."""

    def close(self) -> None:
        """The client is the caller's; nothing to close."""
