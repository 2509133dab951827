"""The live factorisation's store: the same behaviour from the memory and the Redis backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from feature_store.errors import StoreUnavailable
from feature_store.factors import MemoryFactors
from feature_store.factors.redis import RedisFactors

Store = MemoryFactors | RedisFactors


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryFactors()
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield RedisFactors(client, "ranker")
    client.close()


def vectors(rows: int, value: float = 1.0) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) * value


def test_nothing_published_reads_nothing(store: Store) -> None:
    assert store.read("u1") == (None, None)


def test_a_fit_is_read_back_and_a_fold_in_moves_one_user(store: Store) -> None:
    version = store.publish(["a", "b", "c"], vectors(3), ["u1", "u2"], vectors(2, 2.0))
    items, user = store.read("u1")
    assert items is not None and user is not None
    assert items.version == version and items.ids == ("a", "b", "c") and items.dim == 4
    np.testing.assert_array_equal(items.vectors, vectors(3))
    np.testing.assert_array_equal(user, vectors(2, 2.0)[0])
    assert items.rows(["c", "zz", "a"]).tolist() == [2, -1, 0]
    assert store.read("nobody")[1] is None

    store.fold(version, ["u2", "u3"], np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(store.read("u2")[1], np.ones(4))
    np.testing.assert_array_equal(store.read("u3")[1], np.ones(4))
    np.testing.assert_array_equal(store.read("u1")[1], vectors(2, 2.0)[0])


def test_a_new_fit_replaces_every_user_and_a_late_fold_in_is_ignored(store: Store) -> None:
    first = store.publish(["a"], vectors(1), ["u1", "u2"], vectors(2))
    second = store.publish(["a", "b"], vectors(2, 3.0), ["u1"], np.full((1, 4), 5, np.float32))
    assert second > first
    store.fold(first, ["u1", "u2"], np.zeros((2, 4), np.float32))  # against the old videos
    items, user = store.read("u1")
    assert items is not None and items.version == second and items.ids == ("a", "b")
    np.testing.assert_array_equal(user, np.full(4, 5))
    assert store.read("u2")[1] is None  # not in the new fit: no factor in its basis


@pytest.mark.redis
def test_two_processes_share_the_fits_and_old_ones_are_dropped(redis_url: str) -> None:
    trainer = redis.Redis.from_url(redis_url)
    serving = redis.Redis.from_url(redis_url)
    writer, reader = RedisFactors(trainer, "ranker"), RedisFactors(serving, "ranker")
    other = RedisFactors(serving, "retrain")  # another family: its own keys
    for i in range(5):
        version = writer.publish(["a", "b"], vectors(2, float(i)), ["u1"], vectors(1, float(i)))
        items, user = reader.read("u1")
        assert items is not None and items.version == version
        np.testing.assert_array_equal(user, vectors(1, float(i))[0])
    writer.fold(version, ["u1"], np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(reader.read("u1")[1], np.ones(4))  # the cached fit's row
    assert other.read("u1") == (None, None)
    kept = {k.decode() for k in trainer.scan_iter(match=f"{writer.prefix}items:*")}
    assert kept == {f"{writer.prefix}items:{version - 1}", f"{writer.prefix}items:{version}"}
    trainer.close()
    serving.close()


def test_redis_down_is_a_store_error() -> None:
    client = redis.Redis(port=1, socket_connect_timeout=0.2)
    with pytest.raises(StoreUnavailable, match="factors read failed"):
        RedisFactors(client, "ranker").read("u1")


def test_the_memory_store_survives_a_snapshot_and_restore(tmp_path: Path) -> None:
    store = MemoryFactors()
    store.snapshot(tmp_path / "empty")  # nothing published: nothing written
    assert not (tmp_path / "empty").exists()
    version = store.publish(["a", "b"], vectors(2), ["u1", "u2"], vectors(2, 2.0))
    store.snapshot(tmp_path / "factors")
    restored = MemoryFactors()
    restored.restore(tmp_path / "factors")
    items, user = restored.read("u2")
    assert items is not None and items.version == version and items.ids == ("a", "b")
    np.testing.assert_array_equal(items.vectors, vectors(2))
    np.testing.assert_array_equal(user, vectors(2, 2.0)[1])
    assert restored.publish(["a"], vectors(1), [], np.zeros((0, 4), np.float32)) > version
