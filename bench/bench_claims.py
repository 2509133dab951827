"""What a batch's group protocol costs a trainer with Redis tables: claims against the plain
progress read and write they replaced (issue #22).

    python -m bench.bench_claims [--batches 5000] [--partitions 4] [--redis-url redis://...]

Every trainer with Redis sparse tables runs it once per batch, alone or not
(:mod:`trainer.distributed`). Before the claims, a batch read the group's
progress (``HMGET``) and raised it after (one ``EVAL``); now it claims its
partitions and reads the progress in one script and raises the progress as
it releases the claims in another (:meth:`GroupSync.claim`,
:meth:`GroupSync.finish`; the fence between them costs no call while a
batch is younger than a third of the claim's TTL). Both are timed here on
the same server, alternating in rounds of 500 batches, each batch of 256
records spread over ``--partitions`` partitions: microseconds per batch,
the median of the rounds. Without ``--redis-url`` a private redis-server is
started on a free port and stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import redis

from feature_store.eventlog.base import ConsumedEvent
from tests.factories import make_event
from trainer.distributed import GroupSync

_PLAIN_ADVANCE = """
for i = 1, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) > current then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
"""
"""The progress write before the claims (``trainer/distributed.py`` at 1dbaa00)."""

ROUND = 500


def _batches(partitions: int, count: int) -> list[list[ConsumedEvent]]:
    event = make_event()
    out, offset = [], 0
    for _ in range(count):
        out.append([
            ConsumedEvent(event, i % partitions, offset + i // partitions, 0) for i in range(256)
        ])
        offset += 256 // partitions
    return out


def _plain(client: Any, key: str, batch: list[ConsumedEvent]) -> None:
    partitions = sorted({r.partition for r in batch})
    client.hmget(key, [str(p) for p in partitions])
    nexts: dict[int, int] = {}
    for r in batch:
        nexts[r.partition] = max(nexts.get(r.partition, 0), r.offset + 1)
    client.eval(_PLAIN_ADVANCE, 1, key, *[x for p, o in sorted(nexts.items()) for x in (p, o)])


def _claimed(sync: GroupSync, batch: list[ConsumedEvent]) -> None:
    sync.claim(batch, list(range(len(batch))))
    sync.fence()
    sync.finish(batch)


def run(batches: int = 5000, partitions: int = 4, redis_url: str | None = None) -> dict[str, Any]:
    server = None
    if redis_url is None:
        from tests.services import RedisServer

        server = RedisServer()
        server.start()
        redis_url = server.url
    try:
        client = redis.Redis.from_url(redis_url)
        client.delete("bench:plain", GroupSync(client, "bench").progress_key)
        sync = GroupSync(client, "bench", member="bench")
        work = _batches(partitions, batches)
        plain: list[float] = []
        claims: list[float] = []
        for start in range(0, batches, ROUND):
            chunk = work[start : start + ROUND]
            began = time.perf_counter()
            for batch in chunk:
                _plain(client, "bench:plain", batch)
            plain.append((time.perf_counter() - began) / len(chunk) * 1e6)
            began = time.perf_counter()
            for batch in chunk:
                _claimed(sync, batch)
            claims.append((time.perf_counter() - began) / len(chunk) * 1e6)
        client.close()
    finally:
        if server is not None:
            server.stop()
    return {
        "plain_us": statistics.median(plain),
        "claims_us": statistics.median(claims),
        "rounds": len(plain),
        "partitions": partitions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    result = run(args.batches, args.partitions, args.redis_url)
    print({**result, "load_average_before": load, "load_average_after": os.getloadavg()})
    print(
        f"per batch: progress read + write {result['plain_us']:.0f} us, claim + finish "
        f"{result['claims_us']:.0f} us (median of {result['rounds']} rounds of {ROUND})"
    )


if __name__ == "__main__":
    main()
