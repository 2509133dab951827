"""The trainer's metrics time series and heartbeat, on both backends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from feature_store.ops.timeseries import MemorySeries, MetricsSeries, RedisSeries, open_timeseries
from feature_store.settings import Settings


@pytest.fixture(params=["memory", "redis"])
def series(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetricsSeries]:
    if request.param == "memory":
        yield MemorySeries(tmp_path / "ts", capacity=5)
        return
    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url)
    yield RedisSeries(client, "t", capacity=5)
    client.close()


def test_append_read_latest(series: MetricsSeries) -> None:
    for i in range(3):
        series.append({"auc": 0.5 + i / 10, "ts_ms": 1_000 + i})
    assert [p["auc"] for p in series.read()] == [0.5, 0.6, 0.7]
    assert series.latest() == {"auc": 0.7, "ts_ms": 1_002}
    assert len(series.read(limit=2)) == 2


def test_nan_is_stored_as_null(series: MetricsSeries) -> None:
    series.append({"auc": float("nan")})
    latest = series.latest()
    assert latest is not None and latest["auc"] is None and latest["ts_ms"] > 0


def test_since_filters_by_time(series: MetricsSeries) -> None:
    series.append({"n": 1})
    time.sleep(0.01)
    cut = int(time.time() * 1000)
    time.sleep(0.01)
    series.append({"n": 2})
    assert [p["n"] for p in series.read(since_ms=cut)] == [2]


def test_capacity_bounds_the_series(series: MetricsSeries) -> None:
    for i in range(200):
        series.append({"n": i})
    points = series.read(limit=1000)
    assert points[-1]["n"] == 199
    assert len(points) <= 120  # memory: exactly 5; redis: MAXLEN ~ trims by whole nodes


def test_heartbeat_expires(series: MetricsSeries) -> None:
    assert series.status() is None
    series.heartbeat({"state": "running"}, ttl_s=60)
    status = series.status()
    assert status is not None and status["state"] == "running"
    # A TTL far shorter than any scheduling delay: the status must go, whenever we look.
    series.heartbeat({"state": "running"}, ttl_s=0.001)
    deadline = time.monotonic() + 30
    while series.status() is not None:
        assert time.monotonic() < deadline, "the heartbeat never expired"
        time.sleep(0.01)


def test_memory_series_survives_reopen_and_other_readers(tmp_path: Path) -> None:
    writer = MemorySeries(tmp_path, capacity=3)
    for i in range(5):
        writer.append({"n": i})
    writer.heartbeat({"state": "running"}, ttl_s=30)
    reader = MemorySeries(tmp_path, capacity=3)
    assert [p["n"] for p in reader.read()] == [2, 3, 4]
    status = reader.status()
    assert status is not None and status["state"] == "running"


def test_open_timeseries_follows_the_store_backend(tmp_path: Path) -> None:
    series = open_timeseries(Settings(data_dir=tmp_path))
    assert isinstance(series, MemorySeries)
    with pytest.raises(ValueError):
        open_timeseries(Settings(data_dir=tmp_path, stores={"backend": "redis"}))
