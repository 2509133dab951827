"""Session-wide real services, flushed per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.services import RedisCluster, RedisServer, TansuBroker


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture()
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the session's redis-server, emptied before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-primary Redis Cluster for the whole session (started on first use)."""
    with RedisCluster(nodes=3) as cluster:
        yield cluster


@pytest.fixture()
def redis_cluster_url(redis_cluster: RedisCluster) -> Iterator[str]:
    """Seed URL of the session's Redis Cluster, every primary emptied before each test."""
    for port in redis_cluster.ports:
        client = redis.Redis(port=port)
        client.flushall()
        client.close()
    yield redis_cluster.url
