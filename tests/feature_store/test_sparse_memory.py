"""The memory backend's own machinery: its hash index and its growing arrays."""

from __future__ import annotations

import numpy as np

from feature_store.settings import SparseSettings
from feature_store.sparse import MemorySparseTable, TableSpec
from feature_store.sparse.key_index import KeyIndex


def test_key_index_agrees_with_a_dict_through_inserts_removals_and_rehashes() -> None:
    rng = np.random.default_rng(0)
    index = KeyIndex()
    model: dict[int, int] = {}
    next_slot = 1
    # Small key ranges force collisions, tombstone reuse and many rehashes.
    for step in range(300):
        universe = 5000 if step % 2 else 2**64 - 1
        candidates = np.unique(
            rng.integers(0, universe, size=rng.integers(1, 400), dtype=np.uint64)
        )
        slots, where = index.find(candidates)
        expected = np.array([model.get(k, 0) for k in candidates.tolist()])
        np.testing.assert_array_equal(slots, expected)
        assert ((where >= 0) == (expected > 0)).all()
        new = candidates[expected == 0]
        index.insert(new, np.arange(next_slot, next_slot + len(new)))
        for k in new.tolist():
            model[k] = next_slot
            next_slot += 1
        if model and step % 3 == 0:
            gone = rng.choice(
                np.array(list(model), dtype=np.uint64), size=len(model) // 3, replace=False
            )
            index.remove(gone)
            for k in gone.tolist():
                del model[k]
        assert len(index) == len(model)
    everything = np.array(list(model), dtype=np.uint64)
    np.testing.assert_array_equal(
        index.find(everything)[0], [model[k] for k in everything.tolist()]
    )


def test_key_zero_and_max_are_ordinary_keys() -> None:
    index = KeyIndex()
    keys = np.array([0, 2**64 - 1], dtype=np.uint64)
    assert (index.find(keys)[0] == 0).all()
    index.insert(keys, np.array([5, 6]))
    np.testing.assert_array_equal(index.find(keys)[0], [5, 6])


def test_capacity_grows_and_expired_slots_are_reused() -> None:
    now = [1000.0]
    table = MemorySparseTable(
        TableSpec("emb", 4, "adagrad"),
        SparseSettings(ttl_s=10),
        clock=lambda: now[0],
        initial_capacity=2,
    )
    first = np.arange(1, 3001, dtype=np.uint64)
    rows = table.pull(first, train=True)
    assert table.stats().rows == 3000
    np.testing.assert_array_equal(table.pull(first), rows)
    capacity = len(table._updated)  # noqa: SLF001 - the property under test
    now[0] += 11
    assert table.expire() == 3000
    second = np.arange(5001, 8001, dtype=np.uint64)
    table.pull(second, train=True)
    assert len(table._updated) == capacity, "freed slots were reused, nothing grew"  # noqa: SLF001
    assert not table.pull(first).any() and table.pull(second).all(axis=1).all()
