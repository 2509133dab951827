"""The activity store in Redis, shared by every API and trainer process.

Layout (prefixes from :mod:`feature_store.constants`):

- ``{HISTORY}{user_id}``: list, newest first, one compact JSON array
  ``["video_id", watch_ratio, ts, "action", "creator_id", "category"]`` per entry
  (:func:`~feature_store.activity.memory.encode_entries`), so a reader can ``LRANGE`` just
  the head. Idle histories expire (``history_ttl_s``, 90 days by default;
  each change renews it), which bounds the keyspace by active users.
- ``{VIDEO_STATS}{video_id}``: hash of the :class:`VideoStats` fields, no
  expiry (lifetime counters).

``record`` is two round trips whatever the batch size: one pipelined
``LRANGE`` of the touched users' histories; the merge in Python with
:mod:`feature_store.activity.rules`; one ``MULTI``/``EXEC`` that rewrites
each changed history (``DEL`` + ``RPUSH`` + ``EXPIRE``, so a reader sees the
old list or the new one, never half of one) and adds each touched video's
counters with one small Lua script (``HINCRBY`` per counter and a
compare-and-set of ``last_ts``, which ``HINCRBY`` cannot express).

The read-merge-write of a history is not guarded against a concurrent
writer of the same user: one consumer owns each user's partition (see
:mod:`feature_store.activity.base`). Counter updates are atomic per video and
safe from any number of writers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import redis
from redis.cluster import RedisCluster

from feature_store.activity import rules
from feature_store.activity.base import NO_STATS, HistoryEntry, VideoStats
from feature_store.activity.memory import (
    decode_entry,
    encode_entries,
    read_snapshot,
    write_snapshot,
)
from feature_store.catalog.base import Video
from feature_store.catalog.redis import store_errors
from feature_store.constants import HISTORY, VIDEO_STATS
from feature_store.errors import StoreUnavailable
from feature_store.events import Event
from feature_store.features.dense import STAT_FIELDS, stats_matrix
from feature_store.settings import FeatureSettings
from feature_store.sparse.resp import command_steps
from feature_store.sparse.steps import Steps

HISTORY_TTL_S = 90 * 24 * 3600
"""Seconds a history survives without a new entry (90 days)."""

_ADD_STATS = """
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_ts') or '0')
if tonumber(ARGV[1]) > last then
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[1])
end
"""
"""KEYS[1]: the stats hash; ARGV: last_ts, then counter/amount pairs."""

_READ_STATS = """
local out = {}
for i = 1, #KEYS do
  local values = redis.call('HMGET', KEYS[i], unpack(ARGV))
  for j = 1, #ARGV do out[#out + 1] = values[j] or '0' end
end
return table.concat(out, ',')
"""
"""KEYS: stats hashes; ARGV: the fields. Every field of every hash, comma-joined (0 where
missing)."""

_STATS_PER_SCRIPT = 2048
"""Hashes per ``_READ_STATS`` call: bounds how long one call holds Redis (about 1 ms)."""

_SET_HISTORY = """
redis.call('DEL', KEYS[1])
if #ARGV > 1 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
  if tonumber(ARGV[1]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
end
"""
"""Redis Cluster only. KEYS[1]: a history; ARGV: TTL in s (0: none), then the entries."""


def _stats_values(replies: Sequence[Any], videos: int) -> npt.NDArray[np.float64]:
    """The ``(videos, STAT_FIELDS)`` matrix of ``_READ_STATS`` replies (comma-joined)."""
    values = np.concatenate([np.fromstring(r, dtype=np.float64, sep=",") for r in replies])
    if len(values) != videos * len(STAT_FIELDS):
        raise StoreUnavailable("activity video_stats: a counters reply of the wrong size")
    return values.reshape(videos, len(STAT_FIELDS))


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _encode(history: Sequence[HistoryEntry]) -> list[str]:
    return [json.dumps(triple, separators=(",", ":")) for triple in encode_entries(history)]


def _decode(raw: Sequence[bytes | str]) -> list[HistoryEntry]:
    return [decode_entry(json.loads(item)) for item in raw]


def _stats(raw: dict[Any, Any]) -> VideoStats:
    if not raw:
        return NO_STATS
    fields = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
    return VideoStats(**fields)


class RedisActivity:
    """Activity store in Redis; see the module docstring for layout and round trips.

    ``client``: a redis-py client owned by the caller (not closed by
    :meth:`close`). ``chunk`` (``RedisSettings.batch_chunk``): keys per
    ``SCAN`` page and commands per restore transaction, bounding what one
    round trip carries when walking the whole keyspace; per-request reads
    are one command per key and need no chunking. ``history_ttl_s``: idle
    expiry of a history in seconds, renewed whenever it changes; ``None``
    for none. ``history_prefix`` and ``stats_prefix``: whose copy (serving's
    or the trainer's, :mod:`feature_store.constants`).
    """

    def __init__(
        self,
        client: redis.Redis,
        features: FeatureSettings,
        *,
        chunk: int = 8192,
        history_ttl_s: int | None = HISTORY_TTL_S,
        history_prefix: str = HISTORY,
        stats_prefix: str = VIDEO_STATS,
    ) -> None:
        self.client = client
        self.features = features
        self.rules = rules.history_rules(features)
        self.chunk = chunk
        self.history_ttl_s = history_ttl_s
        self.history_prefix = history_prefix
        self.stats_prefix = stats_prefix
        """Key prefixes: serving's by default, the trainer's own copy's with
        ``TRAINING_HISTORY``/``TRAINING_VIDEO_STATS``."""
        self._add_stats = client.register_script(_ADD_STATS)
        self._read_stats = client.register_script(_READ_STATS)

    def __enter__(self) -> RedisActivity:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- writes ------------------------------------------------------------

    def record(
        self, events: Sequence[Event], videos: Mapping[str, Video | None] | None = None
    ) -> None:
        """Apply a batch of events per :mod:`feature_store.activity.rules`."""
        ordered = rules.in_order(events)
        if not ordered:
            return
        groups = rules.by_user(ordered)
        old = dict(zip(groups, self.histories(list(groups)), strict=True))
        catalog = videos or {}
        durations = rules.durations_of(catalog)
        changed: dict[str, list[HistoryEntry]] = {}
        for user_id, user_events in groups.items():
            new = rules.merge_history(
                old[user_id],
                user_events,
                videos=catalog,
                rules=self.rules,
                durations_ms=durations,
            )
            if new != old[user_id]:
                changed[user_id] = new
        deltas = rules.stats_deltas(ordered)
        if isinstance(self.client, RedisCluster):
            self._record_on_cluster(changed, deltas)
            return
        with store_errors("activity record"):
            pipe = self.client.pipeline(transaction=True)
            for user_id, history in changed.items():
                self._queue_history(pipe, user_id, history)
            for video_id, delta in deltas.items():
                args: list[int | str] = [delta.last_ts]
                for name, amount in delta.increments.items():
                    args += [name, amount]
                self._add_stats(keys=[self.stats_prefix + video_id], args=args, client=pipe)
            pipe.execute()

    def _record_on_cluster(
        self, changed: dict[str, list[HistoryEntry]], deltas: dict[str, Any]
    ) -> None:
        """Redis Cluster: the same writes, each key's atomic on its own.

        A cluster refuses a ``MULTI``/``EXEC`` over keys of several slots, and
        redis-py's cluster pipeline refuses ``EVALSHA``; so each history is
        rewritten by one ``EVAL`` of a script (a reader still sees the old list
        or the new one) and each video's counters by another, pipelined per
        node by the cluster client. What is lost is the batch-wide
        transaction: a reader may see some of a batch's users updated and
        others not yet, for the length of one round trip.
        """
        ttl = self.history_ttl_s or 0
        with store_errors("activity record"):
            pipe = self.client.pipeline(transaction=False)
            for user_id, history in changed.items():
                pipe.execute_command(
                    "EVAL", _SET_HISTORY, 1, self.history_prefix + user_id, ttl,
                    *_encode(history),
                )
            for video_id, delta in deltas.items():
                args: list[int | str] = [delta.last_ts]
                for name, amount in delta.increments.items():
                    args += [name, amount]
                pipe.execute_command("EVAL", _ADD_STATS, 1, self.stats_prefix + video_id, *args)
            pipe.execute()

    def _queue_history(self, pipe: Any, user_id: str, history: Sequence[HistoryEntry]) -> None:
        key = self.history_prefix + user_id
        pipe.delete(key)
        if history:
            pipe.rpush(key, *_encode(history))
            if self.history_ttl_s is not None:
                pipe.expire(key, self.history_ttl_s)

    # --- reads -------------------------------------------------------------

    def history(self, user_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """Newest first; empty for an unknown (or expired) user."""
        if limit is not None and limit <= 0:
            return []
        with store_errors("activity history"):
            stop = -1 if limit is None else limit - 1
            raw = self.client.lrange(self.history_prefix + user_id, 0, stop)
        return _decode(raw)

    def history_steps(self, user_id: str) -> Steps[list[HistoryEntry]]:
        """:meth:`history` as steps (:mod:`feature_store.sparse.steps`), to be read in the
        same round trip as other stores' reads (a cluster's: at once)."""
        if isinstance(self.client, RedisCluster):
            return self.history(user_id)
        command = ("LRANGE", self.history_prefix + user_id, 0, -1)
        (raw,) = yield from command_steps(
            self.client, [command], StoreUnavailable, "activity history failed"
        )
        return _decode(raw)

    def histories(self, user_ids: Sequence[str]) -> list[list[HistoryEntry]]:
        """Several users' histories in one round trip, in the order asked."""
        if not user_ids:
            return []
        with store_errors("activity histories"):
            pipe = self.client.pipeline(transaction=False)
            for user_id in user_ids:
                pipe.lrange(self.history_prefix + user_id, 0, -1)
            replies = pipe.execute()
        return [_decode(raw) for raw in replies]

    def video_stats_matrix(self, video_ids: Sequence[str]) -> npt.NDArray[np.float64]:
        """One ``EVALSHA`` per :data:`_STATS_PER_SCRIPT` ids on a single Redis (one round
        trip for a request's candidates); a cluster, whose keys live on many nodes, reads
        :meth:`video_stats`. The script answers one comma-joined string, parsed in C:
        500 ``HGETALL`` replies through redis-py and ``VideoStats`` cost about 10 ms of
        CPU, most of a Redis-backed request (docs/benchmarks.md, "Serving speed")."""
        if isinstance(self.client, RedisCluster) or not video_ids:
            return stats_matrix(self.video_stats(video_ids))
        keys = [self.stats_prefix + video_id for video_id in video_ids]
        with store_errors("activity video_stats"):
            if len(keys) <= _STATS_PER_SCRIPT:
                replies = [self._read_stats(keys=keys, args=STAT_FIELDS)]
            else:
                pipe = self.client.pipeline(transaction=False)
                for part in _chunks(keys, _STATS_PER_SCRIPT):
                    self._read_stats(keys=part, args=STAT_FIELDS, client=pipe)
                replies = pipe.execute()
        return _stats_values(replies, len(keys))

    def video_stats_matrix_steps(self, video_ids: Sequence[str]) -> Steps[npt.NDArray[np.float64]]:
        """:meth:`video_stats_matrix` as steps (:mod:`feature_store.sparse.steps`), so a
        request's counters ride in the round trip of its history (a cluster's: at once).
        ``EVAL`` with the script's text, not ``EVALSHA``: a steps read cannot load a
        script Redis lost (a restart) and retry."""
        if isinstance(self.client, RedisCluster) or not video_ids:
            return self.video_stats_matrix(video_ids)
        keys = [self.stats_prefix + video_id for video_id in video_ids]
        commands = [
            ("EVAL", _READ_STATS, len(part), *part, *STAT_FIELDS)
            for part in _chunks(keys, _STATS_PER_SCRIPT)
        ]
        replies = yield from command_steps(
            self.client, commands, StoreUnavailable, "activity video_stats failed"
        )
        return _stats_values(replies, len(keys))

    def video_stats(self, video_ids: Sequence[str]) -> list[VideoStats]:
        """Counters in the order asked; zeros for unknown videos; one round trip."""
        if not video_ids:
            return []
        with store_errors("activity video_stats"):
            pipe = self.client.pipeline(transaction=False)
            for video_id in video_ids:
                pipe.hgetall(self.stats_prefix + video_id)
            replies = pipe.execute()
        return [_stats(raw) for raw in replies]

    # --- persistence -------------------------------------------------------

    def _scan(self, prefix: str) -> Iterator[list[str]]:
        """Ids under ``prefix``, a ``SCAN`` page at a time (may repeat an id)."""
        cursor: int = 0
        while True:
            with store_errors("activity scan"):
                cursor, keys = self.client.scan(cursor, match=prefix + "*", count=self.chunk)
            ids = [(k.decode() if isinstance(k, bytes) else k)[len(prefix) :] for k in keys]
            if ids:
                yield ids
            if cursor == 0:
                return

    def _iter_histories(self) -> Iterator[tuple[str, list[HistoryEntry]]]:
        for ids in self._scan(self.history_prefix):
            yield from zip(ids, self.histories(ids), strict=True)

    def _iter_stats(self) -> Iterator[tuple[str, VideoStats]]:
        for ids in self._scan(self.stats_prefix):
            yield from zip(ids, self.video_stats(ids), strict=True)

    def snapshot(self, directory: Path) -> None:
        """Write every history and counter in the shared JSON-lines format.

        Walks the keyspace with ``SCAN``: not a point-in-time view, and a key
        may be seen twice (restoring the duplicate line is harmless).
        """
        write_snapshot(directory, self._iter_histories(), self._iter_stats())

    def restore(self, directory: Path) -> None:
        """Make the store equal to a snapshot from any backend.

        Writes the snapshot first, then deletes the histories and counters it
        lacks; restored histories get a fresh TTL and are cut to
        ``history_length``.
        """
        kept_users: set[str] = set()
        kept_videos: set[str] = set()
        length = self.features.history_length
        pipe = self.client.pipeline(transaction=True)
        queued = 0
        for key, value in read_snapshot(directory):
            if isinstance(value, VideoStats):
                kept_videos.add(key)
                pipe.delete(self.stats_prefix + key)
                counters: dict[Any, int] = value.model_dump()
                pipe.hset(self.stats_prefix + key, mapping=counters)
            else:
                kept_users.add(key)
                self._queue_history(pipe, key, value[:length])
            queued += 1
            if queued >= self.chunk:
                with store_errors("activity restore"):
                    pipe.execute()
                queued = 0
        with store_errors("activity restore"):
            pipe.execute()
        self._delete_except(self.history_prefix, kept_users)
        self._delete_except(self.stats_prefix, kept_videos)

    def _delete_except(self, prefix: str, kept: set[str]) -> None:
        for ids in self._scan(prefix):
            stale = [prefix + key for key in ids if key not in kept]
            if stale:
                with store_errors("activity restore"):
                    self.client.unlink(*stale)

    def close(self) -> None:
        """Nothing to release: the client belongs to whoever opened it."""
