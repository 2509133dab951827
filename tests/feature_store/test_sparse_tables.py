"""The SparseTable contract, one set of tests run against every backend.

Memory tables get an injected clock; Redis tables run on the session's real
redis-server (flushed per test) and use real ``PX`` TTLs and sleeps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster

from feature_store.errors import InvalidInput
from feature_store.settings import SparseSettings
from feature_store.sparse import (
    ClusterSparseTable,
    MemorySparseTable,
    RedisSparseTable,
    SparseTable,
    TableSpec,
    uniform_rows,
)
from feature_store.sparse.initializers import table_seed
from tests.factories import ManualClock


class Backend:
    """Builds tables of one backend and moves its time forward."""

    def __init__(self, name: str, redis_url: str | None) -> None:
        self.name = name
        self.redis_url = redis_url
        self.clock = ManualClock()
        self._clients: list[redis.Redis | RedisCluster] = []
        self.client = self.new_client() if name != "memory" else None

    def new_client(self) -> redis.Redis:
        assert self.redis_url is not None
        client = (
            RedisCluster.from_url(self.redis_url)
            if self.name == "redis-cluster"
            else redis.Redis.from_url(self.redis_url)
        )
        self._clients.append(client)
        return client  # type: ignore[return-value]

    def table(
        self,
        spec: TableSpec,
        *,
        model: str = "main",
        client: redis.Redis | None = None,
        chunk: int = 8192,
        **sparse: object,
    ) -> SparseTable:
        settings = SparseSettings(model_name=model, **sparse)  # type: ignore[arg-type]
        if self.name == "memory":
            return MemorySparseTable(spec, settings, clock=self.clock)
        if self.name == "redis-cluster":
            return ClusterSparseTable(spec, settings, client or self.client, chunk=chunk)  # type: ignore[arg-type]
        return RedisSparseTable(spec, settings, client or self.client, chunk=chunk)  # type: ignore[arg-type]

    def advance(self, seconds: float) -> None:
        if self.name == "memory":
            self.clock.now += seconds
        else:
            time.sleep(seconds)

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    url = None
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    elif request.param == "redis-cluster":  # 3 primaries: a batch's keys span nodes
        url = request.getfixturevalue("redis_cluster_url")
    env = Backend(request.param, url)
    yield env
    env.close()


def keys_of(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


# --- optimizers against hand-written scalar references --------------------

SETTINGS = {
    "learning_rate": 0.1,
    "adagrad_initial_accumulator": 0.2,
    "adam_beta1": 0.8,
    "adam_beta2": 0.95,
    "epsilon": 1e-7,
    "ftrl_alpha": 0.3,
    "ftrl_beta": 0.5,
    "ftrl_l1": 0.4,
    "ftrl_l2": 0.05,
}


def adagrad_reference(
    w: float, g_seq: list[float], s: dict[str, float]
) -> tuple[float, list[float]]:
    acc = s["adagrad_initial_accumulator"]
    for g in g_seq:
        acc += g * g
        w -= s["learning_rate"] * g / (math.sqrt(acc) + s["epsilon"])
    return w, [acc]


def adam_reference(w: float, g_seq: list[float], s: dict[str, float]) -> tuple[float, list[float]]:
    m = v = 0.0
    t = 0
    b1, b2 = s["adam_beta1"], s["adam_beta2"]
    for g in g_seq:
        t += 1
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        w -= s["learning_rate"] * m_hat / (math.sqrt(v_hat) + s["epsilon"])
    return w, [m, v, float(t)]


def ftrl_reference(w: float, g_seq: list[float], s: dict[str, float]) -> tuple[float, list[float]]:
    alpha, beta, l1, l2 = s["ftrl_alpha"], s["ftrl_beta"], s["ftrl_l1"], s["ftrl_l2"]
    z = n = 0.0
    for g in g_seq:
        sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / alpha
        z += g - sigma * w
        n += g * g
        if abs(z) <= l1:
            w = 0.0
        else:
            sign = 1.0 if z > 0 else -1.0
            w = -(z - sign * l1) / ((beta + math.sqrt(n)) / alpha + l2)
    return w, [z, n]


REFERENCES = {"adagrad": adagrad_reference, "adam": adam_reference, "ftrl": ftrl_reference}


def expected_state(optimizer: str, per_weight: list[list[float]]) -> np.ndarray:
    """Lay out per-weight reference state the way the optimizer stores it."""
    if optimizer == "adagrad":
        return np.array([s[0] for s in per_weight])
    if optimizer == "adam":
        return np.array(
            [s[0] for s in per_weight] + [s[1] for s in per_weight] + [per_weight[0][2]]
        )
    return np.array([s[0] for s in per_weight] + [s[1] for s in per_weight])


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "ftrl"])
def test_updates_match_scalar_reference(backend: Backend, optimizer: str) -> None:
    dim = 3
    table = backend.table(TableSpec("t", dim, optimizer), **SETTINGS)  # type: ignore[arg-type]
    keys = keys_of(11, 22, 33, 2**64 - 1)
    initial = table.pull(keys, train=True)
    rng = np.random.default_rng(7)
    history: dict[int, list[np.ndarray]] = {i: [] for i in range(len(keys))}
    # Five pushes over changing subsets, so rows see different step counts.
    for subset in ([0, 1, 2, 3], [0, 1], [1, 2, 3], [3], [0, 1, 2, 3]):
        grads = rng.normal(0, 1, size=(len(subset), dim)).astype(np.float32)
        table.push(keys[subset], grads)
        for row, i in enumerate(subset):
            history[i].append(grads[row])
    weights = table.pull(keys)
    exported = table.export()  # type: ignore[attr-defined]
    assert exported.keys.tolist() == sorted(keys.tolist())
    state_by_key = dict(zip(exported.keys.tolist(), exported.state, strict=True))
    for i, key in enumerate(keys.tolist()):
        per_weight = []
        for j in range(dim):
            w, state = REFERENCES[optimizer](
                float(initial[i, j]), [float(g[j]) for g in history[i]], SETTINGS
            )
            assert weights[i, j] == pytest.approx(w, rel=1e-5, abs=1e-6), (key, j)
            per_weight.append(state)
        np.testing.assert_allclose(
            state_by_key[key], expected_state(optimizer, per_weight), rtol=1e-5, atol=1e-6
        )
    if optimizer == "ftrl":
        assert (weights == 0).any() and (weights != 0).any(), "l1 should zero some weights, not all"


# --- missing rows, initializer, admission ----------------------------------


def test_missing_rows_pull_zeros_for_serving_and_initializer_for_training(backend: Backend) -> None:
    spec = TableSpec("emb", 8, "adagrad")
    table = backend.table(spec, init_scale=0.05)
    keys = keys_of(1, 2, 3, 2**63 + 5)
    assert not table.pull(keys).any()
    assert table.stats().rows == 0, "a serving pull must not create rows"

    first = table.pull(keys, train=True)
    np.testing.assert_array_equal(first, uniform_rows(keys, table_seed("emb"), 8, 0.05))
    assert (np.abs(first) <= 0.05).all() and len(np.unique(first)) == first.size
    np.testing.assert_array_equal(table.pull(keys), first)
    assert table.stats().rows == 4 and table.stats().admissions == 4

    # Another table object (another model, so Redis rows are not shared) initialises identically.
    other = backend.table(spec, model="other", init_scale=0.05)
    np.testing.assert_array_equal(other.pull(keys[::-1], train=True), first[::-1])


def test_a_serving_pull_may_repeat_keys(backend: Backend) -> None:
    """Serving groups keys per column without merging them, so one key can come twice."""
    table = backend.table(TableSpec("emb", 4, "adagrad"), init_scale=0.05)
    keys = keys_of(7, 8, 9)
    rows = table.pull(keys, train=True)
    repeated = keys_of(9, 7, 9, 10, 7)
    got = table.pull(repeated)
    np.testing.assert_array_equal(got, np.stack([rows[2], rows[0], rows[2], np.zeros(4), rows[0]]))


def test_ftrl_rows_start_at_zero(backend: Backend) -> None:
    table = backend.table(TableSpec("wide", 1, "ftrl"))
    keys = keys_of(5, 6)
    assert not table.pull(keys, train=True).any()
    assert table.stats().rows == 2
    table.push(keys, np.array([[3.0], [-3.0]], dtype=np.float32))
    weights = table.pull(keys)
    assert weights[0, 0] < 0 < weights[1, 0]


def test_admission_threshold(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 4, "adagrad"), admission_threshold=3)
    keys = keys_of(100, 200, 300)
    grads = np.ones((3, 4), dtype=np.float32)
    for _ in range(2):
        assert not table.pull(keys, train=True).any()
        table.push(keys, grads)  # dropped: not admitted yet
        assert not table.pull(keys).any()
        assert table.stats().rows == 0 and table.stats().admissions == 0

    third = table.pull(keys, train=True)
    np.testing.assert_array_equal(third, uniform_rows(keys, table_seed("emb"), 4, 0.05))
    assert table.stats().admissions == 3 and table.stats().rows == 3
    table.push(keys, grads)
    assert (table.pull(keys) < third).all(), "pushes apply once admitted"
    # A fourth sighting does not re-admit or reset the row.
    table.pull(keys, train=True)
    assert table.stats().admissions == 3


def test_admission_counts_only_the_keys_sighted(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 2, "adam"), admission_threshold=2)
    table.pull(keys_of(1, 2), train=True)
    rows = table.pull(keys_of(2, 3), train=True)
    assert not rows[1].any() and rows[0].any()
    assert table.stats().admissions == 1


# --- expiry ----------------------------------------------------------------


def test_rows_expire_with_their_state(backend: Backend) -> None:
    spec = TableSpec("emb", 4, "adagrad")
    # Redis keeps real time: the TTL outlasts any scheduling stall before the rows are counted.
    table = backend.table(spec, ttl_s=1.0, adagrad_initial_accumulator=0.1)
    keys = keys_of(7, 8)
    initial = table.pull(keys, train=True)
    table.push(keys, np.ones((2, 4), dtype=np.float32))
    assert table.stats().rows == 2
    backend.advance(1.2)
    assert not table.pull(keys).any()
    table.expire()
    assert table.stats().rows == 0
    # Re-admitted from scratch: initial weights and a fresh accumulator, not the old state.
    np.testing.assert_array_equal(table.pull(keys, train=True), initial)
    np.testing.assert_array_equal(table.export().state, np.full((2, 4), 0.1, np.float32))  # type: ignore[attr-defined]


def test_push_refreshes_ttl(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 2, "adagrad"), ttl_s=1.2)
    keys = keys_of(1)
    table.pull(keys, train=True)
    for _ in range(5):  # 1.5 s in all, past the TTL; a stall under 0.9 s keeps a push within it
        backend.advance(0.3)
        table.push(keys, np.ones((1, 2), dtype=np.float32))
    assert table.pull(keys).any(), "a row updated within its TTL stays"


def test_memory_expire_sweeps_and_counts() -> None:
    clock = ManualClock()
    table = MemorySparseTable(TableSpec("emb", 2, "adagrad"), SparseSettings(ttl_s=10), clock=clock)
    table.pull(keys_of(1, 2, 3), train=True)
    clock.now += 5
    table.push(keys_of(3), np.ones((1, 2), dtype=np.float32))
    assert table.expire(now_s=clock.now + 6) == 2
    assert table.stats().expirations == 2
    clock.now += 6
    assert table.stats().rows == 1 and table.pull(keys_of(3)).any()


def test_sightings_expire(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 2, "adagrad"), admission_threshold=2, ttl_s=0.2)
    table.pull(keys_of(9), train=True)
    backend.advance(0.35)
    table.expire()
    assert not table.pull(keys_of(9), train=True).any(), "the old sighting expired"
    assert table.pull(keys_of(9), train=True).any()


# --- batches, validation, namespaces ---------------------------------------


def test_a_batch_far_larger_than_usual(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 16, "adagrad"))
    rng = np.random.default_rng(1)
    universe = np.unique(rng.integers(0, 2**64 - 1, size=60_000, dtype=np.uint64))
    for start in range(0, 500, 100):
        batch = universe[start : start + 100]
        table.pull(batch, train=True)
        table.push(batch, np.ones((100, 16), dtype=np.float32))
    big = universe[:50_000]
    rows = table.pull(big, train=True)
    assert rows.shape == (50_000, 16) and np.isfinite(rows).all()
    table.push(big, np.full((50_000, 16), 0.5, dtype=np.float32))
    assert table.stats().rows == 50_000
    after = table.pull(big)
    assert (after < rows).all()
    np.testing.assert_array_equal(table.pull(big[::-1]), after[::-1])


def test_empty_batches(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 4, "adagrad"))
    empty = np.zeros(0, dtype=np.uint64)
    assert table.pull(empty, train=True).shape == (0, 4)
    table.push(empty, np.zeros((0, 4), dtype=np.float32))


def test_bad_gradients_are_refused_whole(backend: Backend) -> None:
    table = backend.table(TableSpec("emb", 2, "adagrad"))
    keys = keys_of(1, 2)
    before = table.pull(keys, train=True)
    grads = np.array([[1.0, 1.0], [np.nan, 0.0]], dtype=np.float32)
    with pytest.raises(InvalidInput, match="1 of 2 gradient rows"):
        table.push(keys, grads)
    with pytest.raises(InvalidInput, match="shape"):
        table.push(keys, np.ones((2, 3), dtype=np.float32))
    np.testing.assert_array_equal(table.pull(keys), before)


def test_models_and_tables_are_namespaced(backend: Backend) -> None:
    spec = TableSpec("emb", 4, "adagrad")
    keys = keys_of(1, 2, 3)
    a = backend.table(spec, model="alpha")
    a.pull(keys, train=True)
    a.push(keys, np.ones((3, 4), dtype=np.float32))
    for other in (
        backend.table(spec, model="beta"),
        backend.table(TableSpec("emb2", 4, "adagrad"), model="alpha"),
    ):
        assert not other.pull(keys).any()
        assert other.stats().rows == 0
        other.clear()
    assert a.stats().rows == 3
    a.clear()
    assert a.stats().rows == 0 and not a.pull(keys).any()


# --- snapshots ---------------------------------------------------------------


def fill(table: SparseTable, n: int, dim: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64))
    table.pull(keys, train=True)
    for _ in range(3):
        table.push(keys, rng.normal(size=(len(keys), dim)).astype(np.float32))
    return keys


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "ftrl"])
def test_snapshot_round_trip_is_bit_exact(backend: Backend, tmp_path: Path, optimizer: str) -> None:
    spec = TableSpec("emb", 8, optimizer)  # type: ignore[arg-type]
    table = backend.table(spec)
    keys = fill(table, 3000, 8)
    before = table.export()  # type: ignore[attr-defined]
    table.snapshot(tmp_path / "snap")
    table.snapshot(tmp_path / "snap")  # replacing an existing snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"], "no temporary directories left"

    table.clear()
    assert table.stats().rows == 0
    restored = backend.table(spec)
    assert restored.restore(tmp_path / "snap") == len(keys)
    after = restored.export()  # type: ignore[attr-defined]
    assert after.keys.tobytes() == before.keys.tobytes()
    assert after.weights.tobytes() == before.weights.tobytes()
    assert after.state.tobytes() == before.state.tobytes()
    np.testing.assert_allclose(after.updated_at, before.updated_at, atol=0.05)
    np.testing.assert_array_equal(restored.pull(keys), before.weights[np.argsort(np.argsort(keys))])


def test_restore_skips_rows_already_expired(backend: Backend, tmp_path: Path) -> None:
    spec = TableSpec("emb", 2, "adagrad")
    table = backend.table(spec, ttl_s=0.3)
    table.pull(keys_of(1, 2), train=True)
    table.snapshot(tmp_path / "s")
    backend.advance(0.5)
    assert backend.table(spec, model="other", ttl_s=0.3).restore(tmp_path / "s") == 0


# --- concurrency -------------------------------------------------------------


def adagrad_steps(acc0: float, acc: np.ndarray) -> np.ndarray:
    """Whole updates implied by an accumulator when every gradient is 1.0."""
    return np.round(acc - acc0).astype(int)


def test_concurrent_pushes_never_corrupt_a_row(backend: Backend) -> None:
    spec = TableSpec("emb", 16, "adagrad")
    settings = {"adagrad_initial_accumulator": 0.5, "learning_rate": 0.05, "epsilon": 1e-8}
    keys = np.arange(1, 301, dtype=np.uint64)
    if backend.name == "memory":
        shared = backend.table(spec, **settings)
        writers = [shared, shared]
    else:  # two processes' worth: separate clients and table objects
        writers = [backend.table(spec, client=backend.new_client(), **settings) for _ in range(2)]
    initial = writers[0].pull(keys, train=True)
    grads = np.ones((len(keys), 16), dtype=np.float32)
    pushes = 40
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(table: SparseTable) -> None:
        try:
            start.wait()
            for _ in range(pushes):
                table.push(keys, grads)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors

    data = writers[0].export()  # type: ignore[attr-defined]
    assert data.weights.shape == (len(keys), 16) and data.state.shape == (len(keys), 16)
    assert np.isfinite(data.weights).all() and np.isfinite(data.state).all()
    steps = adagrad_steps(0.5, data.state.astype(np.float64))
    assert (steps == steps[:, :1]).all(), "every weight of a row took the same whole updates"
    assert ((steps >= pushes) & (steps <= 2 * pushes)).all()
    if backend.name == "memory":
        assert (steps == 2 * pushes).all(), "the memory table serializes pushes: none lost"
    # Weights are exactly what that many whole updates give (one writer per row).
    order = np.argsort(keys)
    for row in range(0, len(keys), 37):
        k = int(steps[row, 0])
        w = initial[order[row]].astype(np.float64).copy()
        acc = 0.5
        for _ in range(k):
            acc += 1.0
            w -= 0.05 / (math.sqrt(acc) + 1e-8)
        np.testing.assert_allclose(data.weights[row], w, rtol=1e-4, atol=1e-5)
    if backend.name == "redis":
        client = backend.client
        assert client is not None
        r_prefix = writers[0]._r.prefix  # type: ignore[attr-defined]
        names = [int(k).to_bytes(8, "big") for k in keys]
        assert {len(v) for v in client.mget([r_prefix + n for n in names])} == {2 * 16 * 4}
    if backend.name == "redis-cluster":  # one key at a time: the names span slots
        client = backend.client
        assert client is not None
        r_kinds = writers[0]._r  # type: ignore[attr-defined]
        for k in keys.tolist():
            name = int(k).to_bytes(8, "big")
            assert len(client.get(r_kinds[k % len(r_kinds)].prefix + name)) == 2 * 16 * 4


def test_pulls_while_pushing(backend: Backend) -> None:
    """Embedded mode: the trainer pushes while API threads pull; pulls see whole rows."""
    table = backend.table(TableSpec("emb", 8, "adagrad"))
    keys = np.arange(1, 2001, dtype=np.uint64)
    table.pull(keys, train=True)
    stop = threading.Event()
    errors: list[BaseException] = []

    def pusher() -> None:
        try:
            while not stop.is_set():
                table.push(keys, np.full((len(keys), 8), 0.1, dtype=np.float32))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=pusher)
    thread.start()
    try:
        for _ in range(30):
            rows = table.pull(keys)
            assert rows.shape == (2000, 8) and np.isfinite(rows).all()
    finally:
        stop.set()
        thread.join()
    assert not errors
