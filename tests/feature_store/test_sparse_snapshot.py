"""The snapshot format: one directory, plain arrays, shared by both backends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from feature_store.errors import ConfigurationError, InvalidInput
from feature_store.settings import SparseSettings
from feature_store.sparse import (
    MemorySparseTable,
    RedisSparseTable,
    SnapshotData,
    TableSpec,
    read_snapshot,
    write_snapshot,
)
from feature_store.sparse.snapshot import FORMAT_VERSION

SPEC = TableSpec("emb", 8, "adam")


def filled_memory_table(n: int = 2000) -> tuple[MemorySparseTable, np.ndarray]:
    table = MemorySparseTable(SPEC, SparseSettings())
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64))
    table.pull(keys, train=True)
    for _ in range(3):
        table.push(keys, rng.normal(size=(len(keys), 8)).astype(np.float32))
    return table, keys


def test_layout_and_manifest(tmp_path: Path) -> None:
    table, keys = filled_memory_table()
    table.snapshot(tmp_path / "emb")
    assert sorted(p.name for p in (tmp_path / "emb").iterdir()) == [
        "keys.npy",
        "manifest.json",
        "state.npy",
        "updated_at.npy",
        "weights.npy",
    ]
    manifest = json.loads((tmp_path / "emb" / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["table"] == {"name": "emb", "dim": 8, "optimizer": "adam"}
    assert manifest["rows"] == len(keys) and manifest["state_width"] == 17
    assert np.load(tmp_path / "emb" / "keys.npy", allow_pickle=False).dtype == np.uint64
    assert np.load(tmp_path / "emb" / "weights.npy", allow_pickle=False).shape == (len(keys), 8)


def test_mismatched_or_missing_snapshots_are_refused(tmp_path: Path) -> None:
    table, _ = filled_memory_table(10)
    table.snapshot(tmp_path / "s")
    with pytest.raises(ConfigurationError, match="dim=8"):
        MemorySparseTable(TableSpec("emb", 4, "adam"), SparseSettings()).restore(tmp_path / "s")
    with pytest.raises(ConfigurationError, match="optimizer=adam"):
        MemorySparseTable(TableSpec("emb", 8, "adagrad"), SparseSettings()).restore(tmp_path / "s")
    with pytest.raises(InvalidInput, match="manifest.json missing"):
        table.restore(tmp_path / "nothing")
    manifest = tmp_path / "s" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(InvalidInput, match="99"):
        table.restore(tmp_path / "s")


def test_pickled_arrays_are_never_loaded(tmp_path: Path) -> None:
    table, _ = filled_memory_table(10)
    table.snapshot(tmp_path / "s")
    np.save(tmp_path / "s" / "keys.npy", np.array([object()] * 10, dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInput, match="keys"):
        read_snapshot(tmp_path / "s", SPEC, 17)


def test_a_failed_write_leaves_the_previous_snapshot(tmp_path: Path) -> None:
    table, keys = filled_memory_table(50)
    table.snapshot(tmp_path / "s")
    bad = SnapshotData(
        SPEC,
        keys,
        np.zeros((len(keys), 8), np.float32),
        np.zeros((len(keys), 17), np.float32),
        np.zeros(len(keys)),
    )
    object.__setattr__(bad, "weights", "not an array")  # fails while writing the files
    with pytest.raises(Exception):  # noqa: B017 - any failure will do
        write_snapshot(tmp_path / "s", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    assert read_snapshot(tmp_path / "s", SPEC, 17).keys.tolist() == keys.tolist()


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.mark.redis
def test_memory_snapshot_seeds_redis_and_back(tmp_path: Path, redis_client: redis.Redis) -> None:
    memory, keys = filled_memory_table()
    memory.snapshot(tmp_path / "from-memory")

    remote = RedisSparseTable(SPEC, SparseSettings(), redis_client, chunk=500)
    remote.pull(np.array([42], dtype=np.uint64), train=True)  # replaced by the restore
    assert remote.restore(tmp_path / "from-memory") == len(keys)
    assert remote.stats().rows == len(keys)
    assert remote.pull(keys).tobytes() == memory.pull(keys).tobytes()
    assert not remote.pull(np.array([42], dtype=np.uint64)).any()

    # Training continues identically on both.
    grads = np.full((len(keys), 8), 0.3, dtype=np.float32)
    memory.push(keys, grads)
    remote.push(keys, grads)
    assert remote.pull(keys).tobytes() == memory.pull(keys).tobytes()

    remote.snapshot(tmp_path / "from-redis")
    back = MemorySparseTable(SPEC, SparseSettings())
    assert back.restore(tmp_path / "from-redis") == len(keys)
    expected, got = memory.export(), back.export()
    assert got.keys.tobytes() == expected.keys.tobytes()
    assert got.weights.tobytes() == expected.weights.tobytes()
    assert got.state.tobytes() == expected.state.tobytes()
    np.testing.assert_allclose(got.updated_at, expected.updated_at, atol=0.05)


@pytest.mark.redis
def test_redis_restore_keeps_each_rows_remaining_ttl(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    now = 1_700_000_000.0
    table = MemorySparseTable(SPEC, SparseSettings(ttl_s=100), clock=lambda: now)
    keys = np.array([1, 2], dtype=np.uint64)
    table.pull(keys, train=True)
    data = table.export()
    import time

    aged = SnapshotData(
        SPEC, data.keys, data.weights, data.state, np.array([time.time() - 90, time.time() - 10])
    )
    write_snapshot(tmp_path / "s", aged)
    remote = RedisSparseTable(SPEC, SparseSettings(ttl_s=100), redis_client)
    assert remote.restore(tmp_path / "s") == 2
    ttls = [redis_client.pttl(remote._r.prefix + int(k).to_bytes(8, "big")) for k in keys]  # noqa: SLF001
    assert 8_000 < ttls[0] <= 10_000 and 88_000 < ttls[1] <= 90_000
