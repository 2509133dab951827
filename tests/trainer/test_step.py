"""Pushes that outlive the step (begun on the trainer's thread): every push lands once,
failures are retried alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from feature_store.errors import SparseTableUnavailable
from feature_store.features.columns import FeatureRow
from feature_store.features.schema import default_schema
from feature_store.runtime.resources import table_specs
from feature_store.settings import Settings
from feature_store.sparse.memory import MemorySparseTable
from trainer.model import WideDeep
from trainer.step import Trainer


class CountingTable:
    """A memory table that counts pushes and can be told to fail the next ones."""

    def __init__(self, inner: MemorySparseTable) -> None:
        self.inner = inner
        self.pushes = 0
        self.fail = 0

    def pull(self, keys: np.ndarray, *, train: bool = False) -> np.ndarray:
        return self.inner.pull(keys, train=train)

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        if self.fail:
            self.fail -= 1
            raise SparseTableUnavailable("down")
        self.pushes += 1
        self.inner.push(keys, grads)


def _setup() -> tuple[Trainer, dict[str, CountingTable], list[FeatureRow]]:
    settings = Settings()
    schema = default_schema(settings.features)
    tables = {
        spec.name: CountingTable(MemorySparseTable(spec, settings.sparse))
        for spec in table_specs(schema, settings)
    }
    torch.manual_seed(0)
    trainer = Trainer(schema, tables, WideDeep(schema, (16,)), 0.01)
    rows = [
        FeatureRow(user_id=f"u{i}", video_id=f"v{i % 3}", ts_ms=1_700_000_000_000)
        for i in range(8)
    ]
    return trainer, tables, rows


def _step(trainer: Trainer, rows: list[FeatureRow]) -> None:
    batch = trainer.extractor.extract(rows)
    labels = np.array([i % 2 for i in range(len(rows))], np.float32)
    trainer.step(batch, labels, np.ones(len(rows), np.float32))


class SteppedTable(CountingTable):
    """A counting table whose pushes run as steps (as Redis tables' do): the write
    happens one round after the push is begun, and may be told to fail then."""

    def pull_steps(self, keys: np.ndarray, *, train: bool = False):  # type: ignore[no-untyped-def]
        return self.pull(keys, train=train)
        yield  # noqa: B901 - a generator that finishes in its first round

    def push_steps(self, keys: np.ndarray, grads: np.ndarray):  # type: ignore[no-untyped-def]
        yield  # "reads sent": nothing is written before the next round
        self.push(keys, grads)


def _stepped_setup() -> tuple[Trainer, dict[str, SteppedTable], list[FeatureRow]]:
    trainer, tables, rows = _setup()
    stepped = {name: SteppedTable(table.inner) for name, table in tables.items()}
    trainer.tables = stepped  # type: ignore[assignment]
    return trainer, stepped, rows


def test_begun_pushes_land_at_settle_and_before_the_next_pull() -> None:
    reference, reference_tables, rows = _setup()
    trainer, tables, _ = _stepped_setup()
    _step(reference, rows)
    _step(trainer, rows)
    assert sum(t.pushes for t in tables.values()) == 0, "step only begins the pushes"
    trainer.advance()
    assert {n: t.pushes for n, t in tables.items()} == {
        n: t.pushes for n, t in reference_tables.items()
    }
    trainer.settle()
    _step(reference, rows)
    _step(trainer, rows)  # settles the first step's pushes (none left) before pulling
    trainer.settle()
    batch = trainer.extractor.extract(rows)
    keys = {**batch.table_keys, "wide": batch.wide_keys}
    for name, table in reference_tables.items():
        assert tables[name].pushes == table.pushes
        if name in keys:  # the two-tower tables (tt_*) are not the ranker's: never pushed here
            np.testing.assert_allclose(
                tables[name].pull(keys[name]), table.pull(keys[name]), rtol=1e-6
            )


def test_a_begun_push_that_fails_is_retried_alone_by_the_next_settle() -> None:
    reference, reference_tables, rows = _setup()
    _step(reference, rows)
    once = {n: t.pushes for n, t in reference_tables.items()}
    trainer, tables, _ = _stepped_setup()
    name = next(n for n, count in once.items() if count)
    tables[name].fail = 1  # fails when its write is due, after step() returned
    _step(trainer, rows)
    with pytest.raises(SparseTableUnavailable):
        trainer.settle()
    assert {n: t.pushes for n, t in tables.items()} == {**once, name: 0}
    trainer.settle()  # the loop's retry: only the failed table is pushed again
    trainer.settle()
    assert {n: t.pushes for n, t in tables.items()} == once
    trainer.close()
