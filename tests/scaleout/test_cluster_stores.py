"""Catalog, activity and signals on a Redis Cluster answer as on one server.

The same writes go to a reference store (memory, or a single Redis) and to a
Redis one whose client is a ``RedisCluster`` (3 primaries, keys on every
node); every read must agree.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from feature_store.activity import MemoryActivity, RedisActivity
from feature_store.catalog import MemoryCatalog, RedisCatalog
from feature_store.settings import Settings
from feature_store.signals import RedisSignals, SignalParams
from tests.factories import BASE_TS, make_event, make_video

pytestmark = pytest.mark.redis

PARAMS = SignalParams(half_life_s=3600.0, window=5, neighbors=3, creator_videos=2)


@pytest.fixture()
def cluster(redis_cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster_url)
    assert len(client.get_primaries()) == 3
    yield client
    client.close()


def _events(n: int, seed: int) -> list[object]:
    rng = random.Random(seed)
    types = ["play", "finish", "like", "skip", "impression", "share"]
    return [
        make_event(
            event_id=f"s{seed}-{i}",
            user_id=f"u{rng.randrange(40)}",
            video_id=f"v{rng.randrange(60)}",
            type=rng.choice(types),
            ts=BASE_TS + rng.randrange(600_000),
            watch_ms=rng.randrange(1, 60_000),
            duration_ms=60_000,
        )
        for i in range(n)
    ]


def test_activity_on_a_cluster_matches_memory(cluster: RedisCluster) -> None:
    features = Settings().features
    memory, clustered = MemoryActivity(features), RedisActivity(cluster, features)  # type: ignore[arg-type]
    for seed in range(4):  # several batches: histories are read, merged and rewritten
        batch = _events(300, seed)
        memory.record(batch)  # type: ignore[arg-type]
        clustered.record(batch)  # type: ignore[arg-type]
    users = [f"u{i}" for i in range(40)] + ["nobody"]
    assert clustered.histories(users) == memory.histories(users)
    assert clustered.history("u3", limit=2) == memory.history("u3", limit=2)
    videos = [f"v{i}" for i in range(60)] + ["none"]
    assert clustered.video_stats(videos) == memory.video_stats(videos)
    keys = {node.name: node.redis_connection.dbsize() for node in cluster.get_primaries()}  # type: ignore[union-attr]
    assert all(keys.values()), f"keys on every node: {keys}"


def test_catalog_on_a_cluster_matches_memory(cluster: RedisCluster) -> None:
    memory, clustered = MemoryCatalog(), RedisCatalog(cluster, chunk=64)  # type: ignore[arg-type]
    videos = [make_video(creator_id=f"c{i % 7}") for i in range(200)]
    for store in (memory, clustered):
        store.upsert(videos)
        store.set_hidden(videos[5].video_id, True)
        store.set_hidden(videos[9].video_id, True)
        store.set_hidden(videos[9].video_id, False)
    ids = [v.video_id for v in videos] + ["unknown"]
    assert clustered.get_many(ids) == memory.get_many(ids)
    assert clustered.get(videos[5].video_id) == memory.get(videos[5].video_id)
    assert clustered.recent(50) == memory.recent(50)
    assert clustered.count() == memory.count() == 200
    assert sorted(v.video_id for v in clustered.iter_all()) == sorted(ids[:-1])


def test_signals_on_a_cluster_match_a_single_redis(cluster: RedisCluster, redis_url: str) -> None:
    """Against a single Redis, not memory: the two break ties at the neighbour cut
    differently (Redis by member name)."""
    single = redis.Redis.from_url(redis_url)
    reference, clustered = RedisSignals(single, PARAMS), RedisSignals(cluster, PARAMS)  # type: ignore[arg-type]
    videos = [make_video(creator_id=f"c{i % 3}") for i in range(12)]
    for store in (reference, clustered):
        store.index_videos(videos)
        for seed in range(3):
            store.record(_events(200, seed))  # type: ignore[arg-type]
        # Far later: the trending scores are rescaled (landmark moved) on the way.
        store.record([make_event(video_id="late", ts=BASE_TS + 400 * 3600 * 1000)])

    def rounded(pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return [(v, round(s, 6)) for v, s in pairs]

    assert rounded(clustered.trending(20)) == rounded(reference.trending(20))
    assert clustered.trending(1)[0][0] == "late"
    seeds = ["v1", "v2", "v3"]
    assert rounded(clustered.covisited(seeds, 10)) == rounded(reference.covisited(seeds, 10))
    creators = ["c0", "c1", "c2"]
    assert clustered.creator_videos(creators, 6) == reference.creator_videos(creators, 6)
    single.close()
