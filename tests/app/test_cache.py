"""The short-TTL read cache of the Redis deployment: correct rows, bounded staleness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from app.cache import BIG_LOOKUP, RowCache, TtlCache
from app.main import create_app
from feature_store.settings import Settings
from feature_store.sparse import TableSpec, open_table
from tests.app.conftest import KEY, TestClient, make_settings, publish_model, service_of, wait_for
from tests.factories import ManualClock, make_video


def test_ttl_cache_fetches_only_misses_and_expires() -> None:
    calls: list[list[str]] = []

    def fetch(keys: list[str]) -> list[str]:
        calls.append(keys)
        return [k.upper() for k in keys]

    clock = ManualClock()
    cache: TtlCache[str, str] = TtlCache(ttl_s=0.05, clock=clock)
    assert cache.get_many(["a", "b"], fetch) == ["A", "B"]
    clock.advance(0.04)
    assert cache.get_many(["b", "c", "a"], fetch) == ["B", "C", "A"]
    assert calls == [["a", "b"], ["c"]]
    clock.advance(0.02)  # a and b expired, c not
    cache.get_many(["a", "c"], fetch)
    assert calls[-1] == ["a"]


@pytest.mark.redis
def test_row_cache_matches_the_table_and_sees_updates_after_ttl(redis_url: str) -> None:
    settings = Settings(redis={"url": redis_url}, sparse={"backend": "redis"})
    client = redis.Redis.from_url(redis_url)
    table = open_table(TableSpec("video", 4, "adagrad"), settings, redis_client=client)
    keys = np.arange(1, 301, dtype=np.uint64)
    table.pull(keys[:200], train=True)  # admit 200 of them
    clock = ManualClock()
    cache = RowCache(table, ttl_s=0.2, capacity=512, clock=clock)
    want = table.pull(keys, train=False)
    np.testing.assert_array_equal(cache.pull(keys), want)
    np.testing.assert_array_equal(cache.pull(keys[::-1]), want[::-1])  # hits, any order
    table.push(keys[:10], np.ones((10, 4), dtype=np.float32))
    clock.advance(0.19)
    np.testing.assert_array_equal(cache.pull(keys[:10]), want[:10])  # stale within the TTL
    clock.advance(0.02)
    np.testing.assert_array_equal(cache.pull(keys[:10]), table.pull(keys[:10], train=False))
    table.close()
    client.close()


class CountingTable:
    """A table that counts the keys it was asked for (what the cache missed)."""

    def __init__(self, table: Any) -> None:
        self.table, self.spec, self.asked = table, table.spec, 0

    def pull(self, keys: np.ndarray, train: bool = False) -> np.ndarray:
        self.asked += len(keys)
        return self.table.pull(keys, train=train)  # type: ignore[no-any-return]


def test_row_cache_big_and_small_lookups_read_the_same_rows() -> None:
    """A table's rows are held by a dict until its first big lookup (BIG_LOOKUP keys or
    more), then by a KeyIndex built from it: every store, expiry, re-read and emptying
    reads back the table's rows, on both sides of the switch."""
    table = open_table(TableSpec("title", 4, "adagrad"), Settings())
    rng = np.random.default_rng(3)
    keys = rng.integers(1, 2**63, 3000, dtype=np.uint64)
    table.pull(keys, train=True)
    clock = ManualClock()
    counting = CountingTable(table)
    cache = RowCache(counting, ttl_s=0.2, capacity=1024, clock=clock)  # type: ignore[arg-type]
    small, big = keys[:100], keys[50:50 + BIG_LOOKUP + 100]
    np.testing.assert_array_equal(cache.pull(small), table.pull(small))  # dict only
    np.testing.assert_array_equal(cache.pull(big), table.pull(big))  # builds the index
    assert counting.asked == 100 + len(big) - 50
    again = np.concatenate([big[::-1], big[:7]])  # repeated keys, any order: all hits
    np.testing.assert_array_equal(cache.pull(again), table.pull(again))
    np.testing.assert_array_equal(cache.pull(small[::-1]), table.pull(small[::-1]))
    assert counting.asked == 100 + len(big) - 50
    table.push(big[:10], np.ones((10, 4), dtype=np.float32))
    clock.advance(0.21)  # everything expired: read again, into new slots
    np.testing.assert_array_equal(cache.pull(big), table.pull(big))
    np.testing.assert_array_equal(cache.pull(small), table.pull(small))
    asked = counting.asked
    np.testing.assert_array_equal(cache.pull(big[::-1]), table.pull(big[::-1]))  # new slots hit
    assert counting.asked == asked
    fresh = keys[-BIG_LOOKUP:]  # 812 rows held, 256 more: the cache is emptied first
    np.testing.assert_array_equal(cache.pull(fresh), table.pull(fresh))
    asked = counting.asked
    np.testing.assert_array_equal(cache.pull(fresh[::-1]), table.pull(fresh[::-1]))
    assert counting.asked == asked
    np.testing.assert_array_equal(cache.pull(small), table.pull(small))
    assert counting.asked == asked + len(small)  # gone with the rest


@pytest.mark.redis
def test_hide_through_this_process_applies_at_once_despite_the_cache(
    tmp_path: Path, redis_url: str
) -> None:
    settings = make_settings(
        tmp_path,
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        api={"hot_row_cache_ttl_ms": 1500},
    )
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None)
        videos = [json.loads(make_video(video_id=f"hc{i}").model_dump_json()) for i in range(3)]
        client.put("/v1/videos", json={"videos": videos}, headers=KEY)
        ask = {"user_id": "u1", "candidates": ["hc0", "hc1", "hc2"]}
        assert len(client.post("/v1/recommend", json=ask).json()["items"]) == 3
        client.post("/v1/videos/hc1/hide", headers=KEY)
        ids = [i["video_id"] for i in client.post("/v1/recommend", json=ask).json()["items"]]
        assert sorted(ids) == ["hc0", "hc2"]


@pytest.mark.redis
def test_catalog_changes_from_another_process_apply_within_the_catalog_ttl(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.cache

    monkeypatch.setattr(app.cache, "CATALOG_TTL_S", 0.4)
    settings = make_settings(
        tmp_path,
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        api={"hot_row_cache_ttl_ms": 100},
    )
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None)
        videos = [json.loads(make_video(video_id=f"xp{i}").model_dump_json()) for i in range(3)]
        client.put("/v1/videos", json={"videos": videos}, headers=KEY)
        ask = {"user_id": "u1", "candidates": ["xp0", "xp1", "xp2"]}
        assert len(client.post("/v1/recommend", json=ask).json()["items"]) == 3
        service.resources.catalog.set_hidden("xp1", True)  # as another process would

        def hidden() -> bool:
            ids = [i["video_id"] for i in client.post("/v1/recommend", json=ask).json()["items"]]
            return sorted(ids) == ["xp0", "xp2"]

        # Within the catalog TTL (0.4 s here); the exact bound is test_video_table's, on a
        # clock moved by hand.
        wait_for(hidden, timeout_s=10)
