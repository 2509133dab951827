"""One training step: rows -> keys -> pull -> forward/backward -> push -> dense step.

The order is what makes a step safe to retry and to count: scores for the
prequential metrics come from the forward pass *before* any parameter moves;
the sparse pushes happen before the dense optimizer steps, and the caller
commits offsets only after both (see :mod:`trainer.loop`).

A batch's pulls, and its pushes, run for all tables at once on this thread
(:mod:`feature_store.sparse.steps`): Redis tables send every table's
commands before reading any reply, so the server works on one table while
this thread decodes another. (A thread pool running one table per call,
``io_threads``, measured no faster and was removed: see docs/benchmarks.md.)

The pushes of Redis tables are only *begun* by :meth:`Trainer.step` (their
reads sent); the dense step runs at once, :meth:`Trainer.advance` (which
the loop calls before recording the batch's activity) runs their next round
(the optimizer, the writes sent), and :meth:`Trainer.settle` reads the
last replies. All on this thread: the Redis server applies the pushes on
the other core while this one does the dense step and the loop's
bookkeeping, with no thread hand-off (a background push thread,
``overlap_push``, measured slower and was removed). The caller settles before
anything that must follow the pushes (its journal line, a checkpoint), and
the next step settles before its pull, so every pull still sees every
earlier push. A push that fails after the step returned is kept and only
that table's push is run again by the next :meth:`Trainer.settle`: a table
whose push succeeded is never pushed twice. (A push that fails while being
begun, before any write was sent, fails the step, as with memory tables,
whose pushes always run whole inside the step.)

Loss: the *sum* of per-sample (weighted) binary cross-entropy. Summing, not
averaging, keeps each key's gradient proportional to how often the batch
used it, independent of batch size; the sparse optimizers (Adagrad, FTRL)
normalise step sizes per key, and Adam is invariant to the scale.

With heads (:data:`feature_store.heads.HEADS`) the loss is the sum over
heads of each head's summed loss (its spec's ``loss``, :data:`LOSSES`: all
cross-entropy, the watch head's target a soft label in [0, 1]) times its
``head_loss_weights`` entry, each sample counting only for the heads it has
a label for (NaN: masked out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.nn import functional

from feature_store.features.extract import BatchFeatures, FeatureExtractor
from feature_store.features.schema import WIDE_TABLE, FeatureSchema
from feature_store.heads import HEADS
from feature_store.models import model_io
from feature_store.sparse.base import Keys, Rows, SparseTable
from feature_store.sparse.steps import Rounds, errors, pull_many, push_many, start_pushes
from trainer.model import WideDeep

LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "bce": lambda logits, target, weight: functional.binary_cross_entropy_with_logits(
        logits, target, weight=weight, reduction="sum"
    ),
}
"""Each :data:`~feature_store.heads.Loss` as ``(logits, targets, weights) -> summed loss``
over ``(B, h)`` columns of the heads that use it."""


def _loss_columns(width: int) -> list[tuple[str, list[int]]]:
    """The first ``width`` heads' positions grouped by loss, in first-use order (one
    call per loss: with every head on ``bce`` the loss is one fused call)."""
    groups: dict[str, list[int]] = {}
    for i, head in enumerate(HEADS[:width]):
        groups.setdefault(head.loss, []).append(i)
    return list(groups.items())


Push = tuple[SparseTable, Keys, Rows]
"""One table's share of a step's pushes: the table, its keys, their gradients."""


@dataclass
class StepResult:
    """What one step reports to the metrics."""

    scores: npt.NDArray[np.float64]
    """Pre-update predicted probabilities of the engagement head (prequential scores)."""
    loss: float
    """Summed loss of the batch before the update."""
    unique_keys: int
    heads: npt.NDArray[np.float64] | None = None
    """``(B, H)`` pre-update predictions of every head (HEADS order)."""


def to_inputs(
    schema: FeatureSchema,
    batch: BatchFeatures,
    table_rows: dict[str, npt.NDArray[np.float32]],
    wide_rows: npt.NDArray[np.float32],
    requires_grad: bool = False,
) -> list[Tensor]:
    """Model inputs in :func:`feature_store.models.model_io.input_names` order."""
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
    if model_io.has_sequences(schema):
        tensors.append(torch.from_numpy(batch.sequence_rows()))
    return tensors


class Trainer:
    """Holds the dense network, its optimizer and the tables; runs steps."""

    def __init__(
        self,
        schema: FeatureSchema,
        tables: dict[str, SparseTable],
        model: WideDeep,
        learning_rate: float,
        head_weights: Sequence[float] | None = None,
    ) -> None:
        self.schema = schema
        self.head_weights = torch.tensor(
            list(head_weights) if head_weights is not None else [1.0] * model.n_heads,
            dtype=torch.float32,
        )
        """Multiplier of each head's loss (``trainer.head_loss_weights``, HEADS order)."""
        self.tables = tables
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
        self.extractor = FeatureExtractor(schema)
        self._table_names = list(schema.table_dims())
        self._failed: list[Push] = []
        """Pushes that failed, to run again (and only them) at the next settle."""
        self._begun: tuple[list[Push], Rounds] | None = None
        """The last step's pushes, begun on this thread and not yet settled."""

    def close(self) -> None:
        """Abandons pushes begun and never settled (the loop stopped on an error):
        their connections are dropped, and what Redis already received of them
        may or may not have been applied."""
        if self._begun is not None:
            self._begun[1].close()
            self._begun = None

    def pull(
        self, batch: BatchFeatures, train: bool
    ) -> tuple[dict[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]]:
        names = [*self._table_names, WIDE_TABLE]
        keys = [*(batch.table_keys[t] for t in self._table_names), batch.wide_keys]
        requests = [(self.tables[t], k) for t, k in zip(names, keys, strict=True)]
        rows = pull_many(requests, train=train)
        return dict(zip(self._table_names, rows[:-1], strict=True)), rows[-1]

    def _push(self, pushes: Sequence[Push]) -> list[Exception | None]:
        """Run ``pushes``, all tables at once; each one's error or None."""
        return push_many(pushes)

    def step(
        self,
        batch: BatchFeatures,
        labels: npt.NDArray[np.float32],
        weights: npt.NDArray[np.float32],
    ) -> StepResult:
        """Train on one extracted batch; returns the pre-update scores.

        ``labels`` is ``(B,)`` (the engagement head alone) or ``(B, H)``, one
        column per head, NaN where a sample has no label for that head.
        """
        self.settle()  # the previous step's pushes land before this pull
        table_rows, wide_rows = self.pull(batch, train=True)
        inputs = to_inputs(self.schema, batch, table_rows, wide_rows, requires_grad=True)
        self.model.train()
        head_logits = self.model.head_logits(*inputs)
        loss = self._loss(head_logits, labels, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        n = len(self._table_names)
        pushes: list[Push] = []
        for name, tensor in zip(self._table_names, inputs[:n], strict=True):
            if tensor.grad is not None and len(batch.table_keys[name]):
                pushes.append((self.tables[name], batch.table_keys[name], tensor.grad.numpy()))
        wide_grad = inputs[n + len(self.schema.embedded)].grad
        if wide_grad is not None and len(batch.wide_keys):
            pushes.append((self.tables[WIDE_TABLE], batch.wide_keys, wide_grad.numpy()))
        rounds = start_pushes(pushes)
        if rounds.done or rounds.failed:  # nothing left to wait for, or refused at once
            self._raise_first(errors(rounds.finish()))
        else:
            self._begun = (pushes, rounds)
        self.optimizer.step()
        heads = torch.sigmoid(head_logits.detach()).double().numpy()
        return StepResult(heads[:, 0].copy(), float(loss.detach()), batch.unique_key_count, heads)

    def _loss(
        self,
        head_logits: Tensor,
        labels: npt.NDArray[np.float32],
        weights: npt.NDArray[np.float32],
    ) -> Tensor:
        """Each head's loss (:attr:`~feature_store.heads.HeadSpec.loss`) summed over its
        labelled samples, weighted, summed over the heads."""
        target = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32))
        if target.dim() == 1:
            target = target.unsqueeze(1)
        width = target.shape[1]
        known = ~torch.isnan(target)
        per_head = self.head_weights[:width].unsqueeze(0)
        weight = torch.from_numpy(weights).unsqueeze(1) * known * per_head
        target = torch.where(known, target, 0.0)
        total = head_logits.new_zeros(())
        for loss, columns in _loss_columns(width):
            total = total + LOSSES[loss](
                head_logits[:, columns], target[:, columns], weight[:, columns]
            )
        return total

    @staticmethod
    def _raise_first(outcomes: list[Exception | None]) -> None:
        for error in outcomes:
            if error is not None:
                raise error

    def advance(self) -> None:
        """Run one more round of the pushes begun by the last step, if any; never blocks
        for long (the replies it reads were asked for a step earlier) and never raises
        (a failed push is reported by :meth:`settle`)."""
        if self._begun is not None:
            self._begun[1].advance()

    def settle(self) -> None:
        """Wait for the last step's pushes; rerun any that failed; raise if one still fails.

        Raises the first push error (e.g. ``SparseTableUnavailable``) after
        every push of the step has finished; the failed ones stay pending, so
        calling again (the loop's retry) pushes exactly those tables.
        """
        failed: list[Push] = []
        problems: list[Exception] = []

        def collect(pushes: list[Push], outcomes: list[Exception | None]) -> None:
            for push, outcome in zip(pushes, outcomes, strict=True):
                if outcome is not None:
                    failed.append(push)
                    problems.append(outcome)

        if self._begun is not None:
            pushes, rounds = self._begun
            self._begun = None
            collect(pushes, errors(rounds.finish()))
        retry, self._failed = self._failed, []
        if retry:
            collect(retry, self._push(retry))
        if problems:
            self._failed = failed
            raise problems[0]

    @torch.no_grad()
    def score(self, batch: BatchFeatures) -> npt.NDArray[np.float64]:
        """Predicted probabilities of the engagement head without training or admitting keys."""
        return self.score_heads(batch)[:, 0].copy()

    @torch.no_grad()
    def score_heads(self, batch: BatchFeatures) -> npt.NDArray[np.float64]:
        """Every head's prediction ``(B, H)``, without training or admitting keys."""
        self.settle()
        table_rows, wide_rows = self.pull(batch, train=False)
        self.model.eval()
        out = self.model.heads(*to_inputs(self.schema, batch, table_rows, wide_rows))
        return out.double().numpy()
