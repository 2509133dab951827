"""A Redis-backed recommend in-process: its wall time, CPU time and Redis reads.

    python bench/bench_redis_reads.py [--requests 400]

Prepares the serving bench's data (``bench_serving.prepare``) on a private
redis-server, opens the service and calls ``Recommender.recommend`` in a
loop: 500 given candidates, then retrieval requests. Per request: wall and
thread CPU time (ms), and from Redis's ``INFO stats`` the commands and the
reads it processed (a read is one connection's input handled once: about
one round trip of one connection), and, in a separate pass of 50 requests,
the round trips the request waited for one after the other (:class:`RoundTrips`:
several connections' commands sent before the first reply is read count once),
and in another, the thread CPU of the hot-row caches' lookups and stores
(:class:`CacheTimes`; ``app.cache.RowCache``) and the keys they were asked for.
Wall minus CPU is the time the request
waited, mostly for Redis and, on a loaded machine, for a core after each
reply (docs/benchmarks.md, "Serving speed (issue #24)"). Run it from the
root of each tree to compare, one after the other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())  # the tree under test, not necessarily this file's

from bench.bench_serving import (  # noqa: E402
    DISTINCT_REQUESTS,
    bench_settings,
    make_requests,
    prepare,
)


class RoundTrips:
    """Counts the round trips a thread waits for: each time it reads a socket after having
    written to one (``s s r r``: one, two connections' commands sent together; ``s r s
    r``: two, one after the other). Patches ``socket.socket`` while :meth:`counting`;
    a separate pass, as the patch costs time of its own."""

    def __init__(self) -> None:
        self.count = 0
        self._sent = False

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        sock = socket.socket
        sendall, recv_into, recv = sock.sendall, sock.recv_into, sock.recv
        me = threading.get_ident()

        def sent(sock: socket.socket, *args: Any) -> Any:
            if threading.get_ident() == me:
                self._sent = True
            return sendall(sock, *args)

        def reading(read: Any) -> Any:
            def read_(sock: socket.socket, *args: Any) -> Any:
                if self._sent and threading.get_ident() == me:
                    self._sent = False
                    self.count += 1
                return read(sock, *args)
            return read_

        socket.socket.sendall = sent  # type: ignore[method-assign]
        socket.socket.recv_into = reading(recv_into)  # type: ignore[method-assign]
        socket.socket.recv = reading(recv)  # type: ignore[method-assign]
        try:
            yield
        finally:
            socket.socket.sendall, socket.socket.recv_into = sendall, recv_into  # type: ignore[method-assign]
            socket.socket.recv = recv  # type: ignore[method-assign]


class CacheTimes:
    """Thread CPU spent in ``RowCache.lookup`` and ``RowCache.store``, and the keys looked
    up (patches the class while :meth:`counting`: a separate pass, like the round trips)."""

    def __init__(self) -> None:
        self.lookup_s = self.store_s = 0.0
        self.keys = self.lookups = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from app.cache import RowCache

        lookup, store = RowCache.lookup, RowCache.store

        def timed_lookup(cache: RowCache, keys: Any) -> Any:
            began = time.thread_time()
            try:
                return lookup(cache, keys)
            finally:
                self.lookup_s += time.thread_time() - began
                self.keys += len(keys)
                self.lookups += 1

        def timed_store(cache: RowCache, keys: Any, rows: Any) -> None:
            began = time.thread_time()
            try:
                store(cache, keys, rows)
            finally:
                self.store_s += time.thread_time() - began

        RowCache.lookup, RowCache.store = timed_lookup, timed_store  # type: ignore[method-assign]
        try:
            yield
        finally:
            RowCache.lookup, RowCache.store = lookup, store  # type: ignore[method-assign]


TRACED = 50
"""Requests of the separate pass that counts round trips."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()

    import redis

    from app.schemas import RecommendRequest
    from app.service import open_service
    from feature_store.runtime.resources import open_resources
    from tests.services import RedisServer

    server = RedisServer()
    server.start()
    try:
        settings = bench_settings(Path(tempfile.mkdtemp(prefix="vidrec-reads-")), "redis",
                                  server.url)
        bodies = make_requests(DISTINCT_REQUESTS, 500)
        prepare(settings, bodies)
        client = redis.Redis.from_url(server.url)
        given = [RecommendRequest.model_validate(b) for b in bodies]
        retrieval = [RecommendRequest.model_validate(
            {"user_id": b["user_id"], "count": 20, "context": b["context"]}) for b in bodies]
        out: dict[str, Any] = {"load_1min_before": round(os.getloadavg()[0], 2)}
        with open_resources(settings) as res, open_service(res) as service:
            recommender = service.recommender
            for request in given[:50]:
                recommender.recommend(request)
            for name, requests in (("given_candidates", given), ("retrieval", retrieval)):
                before = client.info("stats")
                wall, cpu = time.perf_counter(), time.thread_time()
                for i in range(args.requests):
                    recommender.recommend(requests[i % len(requests)])
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                after = client.info("stats")
                n = args.requests
                trips = RoundTrips()
                with trips.counting():
                    for i in range(TRACED):
                        recommender.recommend(requests[i % len(requests)])
                cache = CacheTimes()
                with cache.counting():
                    for i in range(TRACED):
                        recommender.recommend(requests[i % len(requests)])
                out[name] = {
                    "round_trips": round(trips.count / TRACED, 1),
                    "row_cache_lookup_ms": round(cache.lookup_s * 1000 / TRACED, 3),
                    "row_cache_store_ms": round(cache.store_s * 1000 / TRACED, 3),
                    "row_cache_keys": round(cache.keys / TRACED),
                    "row_cache_lookups": round(cache.lookups / TRACED, 1),
                    "wall_ms": round(wall * 1000 / n, 2),
                    "cpu_ms": round(cpu * 1000 / n, 2),
                    "commands": round(
                        (after["total_commands_processed"]
                         - before["total_commands_processed"] - 1) / n, 1),
                    "reads": round(
                        (after["total_reads_processed"] - before["total_reads_processed"] - 1)
                        / n, 1),
                }
        client.close()
        out["load_1min_after"] = round(os.getloadavg()[0], 2)
    finally:
        server.stop()
    print(json.dumps(out, indent=2))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
