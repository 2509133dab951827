"""Redis memory per million sparse rows, measured on a private redis-server.

Writes rows with the layout of ``feature_store/sparse/redis.py``: for each
row one key ``vidrec:v1:sp:main:video:r:`` + 8 key bytes holding ``dim``
float32 weights followed by the optimizer state (Adagrad: ``dim`` float32;
Adam: ``2 * dim + 1``), written with ``SET ... PX ttl`` as the backend does,
pipelined in chunks. It reads
``INFO memory`` before and after and prints the difference per million rows.

    python -m bench.redis_memory                 # 1M rows, dims 16 and 64, Adagrad
    python -m bench.redis_memory --rows 200000 --dims 32 --optimizer adam

``used_memory`` is what ``maxmemory`` is compared against; ``used_memory_rss``
is what the kernel charges the process (and what a container limit sees). Size
a Redis from ``used_memory`` and leave headroom for fragmentation, AOF
rewrite (copy-on-write of the fork) and client buffers (see docs/deploy.md).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import redis

from feature_store.constants import SPARSE_ROWS, sparse_prefix
from feature_store.settings import SparseSettings
from feature_store.sparse.optimizers import make_optimizer
from tests.services import RedisServer

TTL_MS = 30 * 24 * 3600 * 1000  # the default SparseSettings.ttl_s, in ms


def _memory(client: redis.Redis) -> tuple[int, int]:
    info = client.info("memory")
    return int(info["used_memory"]), int(info["used_memory_rss"])


def _write_rows(
    client: redis.Redis, rows: int, dim: int, state_width: int, chunk: int, seed: int
) -> None:
    """Pipelined ``SET key value PX ttl`` of each row, ``chunk`` rows a round trip."""
    prefix = sparse_prefix("main", "video", SPARSE_ROWS)
    rng = np.random.default_rng(seed)
    keys = rng.choice(np.iinfo(np.int64).max, size=rows, replace=False).astype(">u8")
    weights = rng.uniform(-0.05, 0.05, size=(rows, dim)).astype("<f4")
    state = np.full((rows, state_width), 0.1, dtype="<f4")
    values = np.concatenate((weights, state), axis=1)
    key_bytes = keys.tobytes()
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        pipe = client.pipeline(transaction=False)
        for i in range(start, stop):
            k = key_bytes[8 * i : 8 * i + 8]
            pipe.execute_command("SET", prefix + k, values[i].tobytes(), "PX", TTL_MS)
        pipe.execute()


def measure(rows: int, dim: int, optimizer: str, chunk: int) -> dict[str, float]:
    state_width = make_optimizer(optimizer, SparseSettings()).state_width(dim)  # type: ignore[arg-type]
    server = RedisServer()
    with server:
        client = redis.Redis.from_url(server.url)
        try:
            version = client.info("server")["redis_version"]
            before, before_rss = _memory(client)
            started = time.perf_counter()
            _write_rows(client, rows, dim, state_width, chunk, seed=dim)
            elapsed = time.perf_counter() - started
            after, after_rss = _memory(client)
            keys = int(client.dbsize())
        finally:
            client.close()
    per_million = 1_000_000 / rows
    payload = 4 * (dim + state_width)
    return {
        "redis": version,
        "dim": dim,
        "optimizer": optimizer,
        "rows": rows,
        "keys": keys,
        "payload_bytes_per_row": payload,
        "used_mib_per_million": (after - before) * per_million / 2**20,
        "rss_mib_per_million": (after_rss - before_rss) * per_million / 2**20,
        "bytes_per_row": (after - before) / rows,
        "write_s": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--optimizer", choices=["adagrad", "adam"], default="adagrad")
    parser.add_argument("--chunk", type=int, default=8192, help="rows per pipelined round trip")
    args = parser.parse_args()
    print(
        f"{'redis':>7} {'dim':>4} {'optim':>8} {'rows':>9} {'keys':>9} {'payload B':>9} "
        f"{'B/row':>7} {'used MiB/1M':>11} {'rss MiB/1M':>10} {'write s':>7}"
    )
    for dim in args.dims:
        r = measure(args.rows, dim, args.optimizer, args.chunk)
        print(
            f"{r['redis']:>7} {r['dim']:>4} {r['optimizer']:>8} {r['rows']:>9} {r['keys']:>9} "
            f"{r['payload_bytes_per_row']:>9} {r['bytes_per_row']:>7.0f} "
            f"{r['used_mib_per_million']:>11.1f} {r['rss_mib_per_million']:>10.1f} "
            f"{r['write_s']:>7.1f}"
        )


if __name__ == "__main__":
    main()
