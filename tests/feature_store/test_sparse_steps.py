"""Several tables' pulls and pushes interleaved (feature_store.sparse.steps)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import redis

from feature_store.errors import SparseTableUnavailable
from feature_store.settings import SparseSettings
from feature_store.sparse import MemorySparseTable, RedisSparseTable, TableSpec
from feature_store.sparse.base import Keys, Rows, SparseTable
from feature_store.sparse.steps import pull_many, push_many

pytestmark = pytest.mark.redis

SPECS = [TableSpec("a", 4, "adagrad"), TableSpec("b", 8, "adam"), TableSpec("w", 1, "ftrl")]


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


class Failing:
    """A table that is down."""

    def pull(self, keys: Keys, *, train: bool = False) -> Rows:
        raise SparseTableUnavailable("down")

    def push(self, keys: Keys, grads: Rows) -> None:
        raise SparseTableUnavailable("down")


def _batch(seed: int) -> list[tuple[Keys, Rows]]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in SPECS:
        keys = np.unique(rng.integers(0, 500, size=300, dtype=np.uint64))
        out.append((keys, rng.normal(0, 0.1, size=(len(keys), spec.dim)).astype(np.float32)))
    return out


def test_interleaved_pulls_and_pushes_match_one_table_at_a_time(client: redis.Redis) -> None:
    settings = SparseSettings(admission_threshold=2, ttl_s=60)
    one = [RedisSparseTable(s, settings.model_copy(update={"model_name": "one"}), client,
                            chunk=64) for s in SPECS]
    many = [RedisSparseTable(s, settings.model_copy(update={"model_name": "many"}), client,
                             chunk=64) for s in SPECS]
    memory = MemorySparseTable(TableSpec("m", 4, "adagrad"), settings)
    for seed in range(4):  # sightings, admissions, then updates of admitted rows
        batch = _batch(seed)
        expected = [t.pull(k, train=True) for t, (k, _) in zip(one, batch, strict=True)]
        got = pull_many([(t, k) for t, (k, _) in zip(many, batch, strict=True)], train=True)
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_array_equal(e, g)
        for t, (k, grads) in zip(one, batch, strict=True):
            t.push(k, grads)
        assert push_many([(t, k, g) for t, (k, g) in zip(many, batch, strict=True)]) == [None] * 3
    keys = np.arange(500, dtype=np.uint64)
    for a, b in zip(one, many, strict=True):
        assert a.stats().rows == b.stats().rows > 0
        np.testing.assert_array_equal(a.pull(keys), b.pull(keys))
    mixed: list[SparseTable] = [many[0], memory]  # a table without steps runs as one call
    assert len(pull_many([(t, keys) for t in mixed], train=True)) == 2


def test_a_failed_table_does_not_stop_the_others(client: redis.Redis) -> None:
    tables = [RedisSparseTable(s, SparseSettings(), client) for s in SPECS]
    batch = _batch(0)
    for t, (k, _) in zip(tables, batch, strict=True):
        t.pull(k, train=True)
    before = [t.pull(k) for t, (k, _) in zip(tables, batch, strict=True)]
    requests = [(t, k, g) for t, (k, g) in zip(tables, batch, strict=True)]
    outcomes = push_many([requests[0], (Failing(), *requests[1][1:]), requests[2]])  # type: ignore[list-item]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], SparseTableUnavailable)
    after = [t.pull(k) for t, (k, _) in zip(tables, batch, strict=True)]
    assert not np.array_equal(before[0], after[0]) and not np.array_equal(before[2], after[2])
    with pytest.raises(SparseTableUnavailable):
        pull_many([(tables[0], batch[0][0]), (Failing(), batch[1][0])], train=False)  # type: ignore[list-item]


def test_an_operation_stopped_between_steps_leaves_no_stale_reply(client: redis.Redis) -> None:
    table = RedisSparseTable(SPECS[0], SparseSettings(), client)
    keys = np.arange(1, 100, dtype=np.uint64)
    first = table.pull(keys, train=True)
    steps = table.pull_steps(keys)
    next(steps)  # the MGET is sent, its reply not read
    steps.close()  # e.g. another table's failure stopped the rounds
    other = np.arange(1000, 1010, dtype=np.uint64)
    assert not table.pull(other).any(), "a fresh connection: not the first MGET's reply"
    np.testing.assert_array_equal(table.pull(keys), first)


def test_in_process_tables_pull_in_order_and_a_failed_one_does_not_stop_the_others() -> None:
    tables = [MemorySparseTable(s, SparseSettings()) for s in SPECS]
    batch = _batch(1)
    pulled = pull_many([(t, k) for t, (k, _) in zip(tables, batch, strict=True)], train=True)
    for t, (k, _), rows in zip(tables, batch, pulled, strict=True):
        np.testing.assert_array_equal(t.pull(k), rows)
    fresh = [MemorySparseTable(s, SparseSettings()) for s in SPECS]
    requests = [(fresh[0], batch[0][0]), (Failing(), batch[1][0]), (fresh[2], batch[2][0])]
    with pytest.raises(SparseTableUnavailable):
        pull_many(requests, train=True)  # type: ignore[arg-type]
    # The pull after the failed one ran (and admitted its keys), as it would interleaved.
    assert fresh[2].stats().rows == len(batch[2][0]) > 0
