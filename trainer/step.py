"""One training step: rows -> keys -> pull -> forward/backward -> push -> dense step.

The order is what makes a step safe to retry and to count: scores for the
prequential metrics come from the forward pass *before* any parameter moves;
the sparse pushes happen before the dense optimizer steps, and the caller
commits offsets only after both (see :mod:`trainer.loop`).

With ``overlap_push`` (durable tables, e.g. Redis) the pushes are handed to
a background thread and the dense step runs at once; :meth:`Trainer.settle`
waits for them. The caller settles before anything that must follow the
pushes (its journal line, a checkpoint), and the next step settles before
its pull, so every pull still sees every earlier push. The point is to let
the trainer's own Python work (dense step, recording the activity, metrics)
run while the Redis server applies the pushes on the other core. A push
that fails is kept and only that table's push is run again by the next
:meth:`Trainer.settle`: a table whose push succeeded is never pushed twice.

Loss: the *sum* of per-sample (weighted) binary cross-entropy. Summing, not
averaging, keeps each key's gradient proportional to how often the batch
used it, independent of batch size; the sparse optimizers (Adagrad, FTRL)
normalise step sizes per key, and Adam is invariant to the scale.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.nn import functional

from feature_store.features.extract import BatchFeatures, FeatureExtractor
from feature_store.features.schema import WIDE_TABLE, FeatureSchema
from feature_store.sparse.base import SparseTable
from trainer.model import WideDeep

T = TypeVar("T")


@dataclass
class StepResult:
    """What one step reports to the metrics."""

    scores: npt.NDArray[np.float64]
    """Pre-update predicted probabilities (prequential scores)."""
    loss: float
    """Summed loss of the batch before the update."""
    unique_keys: int


def to_inputs(
    schema: FeatureSchema,
    batch: BatchFeatures,
    table_rows: dict[str, npt.NDArray[np.float32]],
    wide_rows: npt.NDArray[np.float32],
    requires_grad: bool = False,
) -> list[Tensor]:
    """Model inputs in :func:`feature_store.model_io.input_names` order."""
    tensors = [
        torch.from_numpy(np.ascontiguousarray(table_rows[t], dtype=np.float32)).requires_grad_(
            requires_grad
        )
        for t in schema.table_dims()
    ]
    tensors += [torch.from_numpy(batch.column_indices[c.name]) for c in schema.embedded]
    wide = np.ascontiguousarray(wide_rows, dtype=np.float32).reshape(-1, 1)
    tensors.append(torch.from_numpy(wide).requires_grad_(requires_grad))
    tensors.append(torch.from_numpy(batch.wide_indices))
    tensors.append(torch.from_numpy(batch.dense))
    return tensors


class Trainer:
    """Holds the dense network, its optimizer and the tables; runs steps."""

    def __init__(
        self,
        schema: FeatureSchema,
        tables: dict[str, SparseTable],
        model: WideDeep,
        learning_rate: float,
        io_threads: int = 1,
        overlap_push: bool = False,
    ) -> None:
        self.schema = schema
        self.tables = tables
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
        self.extractor = FeatureExtractor(schema)
        self._table_names = list(schema.table_dims())
        self._pool = (
            ThreadPoolExecutor(io_threads, thread_name_prefix="vidrec-table-io")
            if io_threads > 1 or overlap_push
            else None
        )
        self.overlap_push = overlap_push
        self._io_threads = io_threads
        self._pending: list[tuple[Callable[[], None], Future[None] | None]] = []
        """Pushes of the last step not yet settled: (call, future), or (call, None) to rerun."""

    def close(self) -> None:
        """Waits for pushes in flight (their outcome is the next settle's, if any)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None  # later steps (a restarted loop) run sequentially

    def _each(self, calls: list[Callable[[], T]]) -> list[T]:
        """Run the calls (one per table), concurrently with a pool; all finish before return.

        Every call completes (or fails) before this returns, so no push is
        still in flight when the caller commits; the first error is raised.
        """
        if self._pool is None or self._io_threads == 1:
            return [call() for call in calls]
        futures = [self._pool.submit(call) for call in calls]
        wait(futures)
        return [f.result() for f in futures]

    def pull(
        self, batch: BatchFeatures, train: bool
    ) -> tuple[dict[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]]:
        names = [*self._table_names, WIDE_TABLE]
        keys = [*(batch.table_keys[t] for t in self._table_names), batch.wide_keys]
        pulled = self._each(
            [partial(self.tables[t].pull, k, train=train) for t, k in zip(names, keys, strict=True)]
        )
        return dict(zip(self._table_names, pulled[:-1], strict=True)), pulled[-1]

    def step(
        self,
        batch: BatchFeatures,
        labels: npt.NDArray[np.float32],
        weights: npt.NDArray[np.float32],
    ) -> StepResult:
        """Train on one extracted batch; returns the pre-update scores."""
        self.settle()  # the previous step's pushes land before this pull
        table_rows, wide_rows = self.pull(batch, train=True)
        inputs = to_inputs(self.schema, batch, table_rows, wide_rows, requires_grad=True)
        self.model.train()
        logits = self.model.logits(*inputs)
        loss = functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(labels), weight=torch.from_numpy(weights), reduction="sum"
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        n = len(self._table_names)
        pushes: list[Callable[[], None]] = []
        for name, tensor in zip(self._table_names, inputs[:n], strict=True):
            if tensor.grad is not None and len(batch.table_keys[name]):
                pushes.append(
                    partial(self.tables[name].push, batch.table_keys[name], tensor.grad.numpy())
                )
        wide_grad = inputs[n + len(self.schema.embedded)].grad
        if wide_grad is not None and len(batch.wide_keys):
            pushes.append(partial(self.tables[WIDE_TABLE].push, batch.wide_keys, wide_grad.numpy()))
        if self.overlap_push and self._pool is not None:
            self._pending = [(call, self._pool.submit(call)) for call in pushes]
        else:
            self._each(pushes)
        self.optimizer.step()
        scores = torch.sigmoid(logits.detach()).double().numpy()
        return StepResult(scores, float(loss.detach()), batch.unique_key_count)

    def settle(self) -> None:
        """Wait for the last step's pushes; rerun any that failed; raise if one still fails.

        Raises the first push error (e.g. ``SparseTableUnavailable``) after
        every push of the step has finished; the failed ones stay pending, so
        calling again (the loop's retry) pushes exactly those tables.
        """
        pending, self._pending = self._pending, []
        failed: list[tuple[Callable[[], None], Future[None] | None]] = []
        error: BaseException | None = None
        for call, future in pending:
            try:
                if future is None:
                    call()
                else:
                    future.result()
            except Exception as exc:
                failed.append((call, None))
                error = error or exc
        if error is not None:
            self._pending = failed
            raise error

    @torch.no_grad()
    def score(self, batch: BatchFeatures) -> npt.NDArray[np.float64]:
        """Predicted probabilities without training or admitting keys."""
        self.settle()
        table_rows, wide_rows = self.pull(batch, train=False)
        self.model.eval()
        out = self.model(*to_inputs(self.schema, batch, table_rows, wide_rows))
        return out.double().numpy()
