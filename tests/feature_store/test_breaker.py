"""Circuit breakers: a dependency known down is not called; it comes back by itself."""

from __future__ import annotations

import pytest
import redis

from feature_store.errors import StoreUnavailable
from feature_store.runtime.breaker import Breaker, CircuitOpen, redis_breaker
from feature_store.settings import RedisSettings, Settings
from feature_store.sparse.factory import connect_redis
from tests.app.conftest import wait_for
from tests.factories import ManualClock
from tests.services import RedisServer


@pytest.mark.redis
def test_a_stopped_redis_is_refused_without_a_connect_until_it_answers_again() -> None:
    server = RedisServer()
    server.start()
    client = connect_redis(RedisSettings(url=server.url, socket_timeout_s=0.5))
    try:
        breaker = redis_breaker(client)
        assert breaker is not None and client.ping() and breaker.up
        server.stop()
        with pytest.raises(redis.RedisError):
            client.get("k")  # finds it gone
        assert breaker.state()["state"] == "down" and breaker.trips == 1
        for _ in range(20):  # refused here, before any socket: no retry, no backoff
            with pytest.raises(CircuitOpen):
                client.get("k")
        assert breaker.refused >= 20
        server.start()  # same port; the prober's PING closes the breaker
        wait_for(lambda: breaker.up, timeout_s=10)
        assert client.set("k", b"v") and client.get("k") == b"v"
    finally:
        client.close()
        server.stop()


@pytest.mark.redis
def test_stores_translate_an_open_circuit_like_any_redis_failure(tmp_path: object) -> None:
    from feature_store.catalog.redis import RedisCatalog

    server = RedisServer()
    server.start()
    client = connect_redis(RedisSettings(url=server.url, socket_timeout_s=0.5))
    try:
        catalog = RedisCatalog(client, chunk=Settings().redis.batch_chunk)
        server.stop()
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                catalog.get_many(["v1"])
    finally:
        client.close()


def test_half_open_lets_one_trial_through_per_interval() -> None:
    clock = ManualClock()
    breaker = Breaker("kafka", retry_s=0.2, clock=clock)
    assert breaker.allow()
    breaker.failed(TimeoutError("no ack"))
    assert not breaker.up and not breaker.allow() and not breaker.allow()
    clock.advance(0.19)
    assert not breaker.allow() and breaker.state()["down_for_s"] == 0.19
    clock.advance(0.02)
    assert breaker.allow()  # the trial
    assert not breaker.allow()  # others keep failing fast meanwhile
    breaker.succeeded()
    assert breaker.up and breaker.allow() and breaker.state() == {"state": "up", "trips": 1}
    assert breaker.retry_after_s() == 1
