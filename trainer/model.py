"""The Wide&Deep network over temporary embedding matrices.

One module serves training and export: :meth:`WideDeep.forward` takes
exactly the inputs named in :mod:`feature_store.model_io`, positionally and
in :func:`~feature_store.model_io.input_names` order, and returns the score;
:meth:`WideDeep.logits` is the same computation before the sigmoid, which
training uses for a numerically stable loss.

Why temporary matrices: the sparse tables hold millions of rows outside
torch. A batch pulls only its unique keys into a small ``(N_t, dim)`` tensor
per table (``requires_grad`` while training), indexes it with the batch's
index tensors, and after ``backward`` each pulled row's gradient is pushed
back to its table. The model itself owns only the dense MLP and a bias.

Padding: index ``N_t`` (one past the last pulled row) points at a zero row
the model appends, so a short tag list or history pools over real rows only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from feature_store.features.columns import MultiValued
from feature_store.features.schema import FeatureSchema


class WideDeep(nn.Module):
    """Wide (sparse FTRL weights, summed) plus deep (pooled embeddings + dense -> MLP).

    ``forward(*inputs)`` expects, in order: one ``(N_t, dim_t)`` matrix per
    table (``schema.table_dims()`` order), one index tensor per embedded
    column (``schema.embedded`` order), ``wide_weights (N_w, 1)``,
    ``wide_idx (B, W)`` and ``dense (B, n_dense)``.
    """

    def __init__(self, schema: FeatureSchema, hidden: Sequence[int] = (128, 64)) -> None:
        super().__init__()
        self.tables = list(schema.table_dims())
        table_pos = {t: i for i, t in enumerate(self.tables)}
        # Per embedded column: (position of its table, pooled?) resolved once.
        self.columns: list[tuple[int, bool]] = [
            (table_pos[c.table_name()], isinstance(c, MultiValued) and c.pooling == "mean")
            for c in schema.embedded
        ]
        self.multi = [isinstance(c, MultiValued) for c in schema.embedded]
        self.n_tables = len(self.tables)
        self.n_columns = len(self.columns)
        self.n_dense = len(schema.dense)
        dims = schema.table_dims()
        deep_in = sum(dims[c.table_name()] for c in schema.embedded) + self.n_dense
        layers: list[nn.Module] = []
        width = deep_in
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        # Dense features arrive roughly in 0..10; a learnt affine per feature
        # keeps a large one from dominating the first layer early on.
        self.dense_norm = nn.LayerNorm(self.n_dense) if self.n_dense else nn.Identity()
        self.bias = nn.Parameter(torch.zeros(1))

    def logits(self, *inputs: Tensor) -> Tensor:
        """Pre-sigmoid scores, shape ``(B,)``."""
        tables = inputs[: self.n_tables]
        indices = inputs[self.n_tables : self.n_tables + self.n_columns]
        wide_weights, wide_idx, dense = inputs[self.n_tables + self.n_columns :]
        padded = [torch.cat([t, t.new_zeros(1, t.shape[1])], dim=0) for t in tables]
        parts: list[Tensor] = []
        for (table, mean), multi, idx in zip(self.columns, self.multi, indices, strict=True):
            rows = padded[table][idx]
            if multi:
                pooled = rows.sum(dim=1)
                if mean:
                    count = (idx < tables[table].shape[0]).sum(dim=1, keepdim=True)
                    pooled = pooled / count.clamp(min=1).to(pooled.dtype)
                rows = pooled
            parts.append(rows)
        parts.append(self.dense_norm(dense))
        deep = self.mlp(torch.cat(parts, dim=1)).squeeze(1)
        wide = wide_weights[wide_idx].sum(dim=(1, 2))
        return deep + wide + self.bias

    def forward(self, *inputs: Tensor) -> Tensor:
        """Predicted probability of a positive outcome, shape ``(B,)``."""
        return torch.sigmoid(self.logits(*inputs))
