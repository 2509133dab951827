"""The Wide&Deep network over temporary embedding matrices.

One module serves training and export: :meth:`WideDeep.forward` takes
exactly the inputs named in :mod:`feature_store.models.model_io`, positionally and
in :func:`~feature_store.models.model_io.input_names` order, and returns the score
(the ``engagement`` head); :meth:`WideDeep.logits` is the same computation
before the sigmoid, which training uses for a numerically stable loss.

Heads (:data:`feature_store.heads.HEADS`, the first the primary one): the deep tower is shared and
its last layer has one output per head; :meth:`WideDeep.head_logits` gives
all of them ``(B, H)``. The wide part and the global bias add to the
engagement head only: the wide table has one weight per key (its dimension
is part of the sparse-table contract), and engagement is the label it was
trained for, so its semantics do not move. The other heads are
deep-only, each with its own bias in the last layer. Export traces
:class:`Heads`, whose outputs are the heads' probabilities in order.

Why temporary matrices: the sparse tables hold millions of rows outside
torch. A batch pulls only its unique keys into a small ``(N_t, dim)`` tensor
per table (``requires_grad`` while training), indexes it with the batch's
index tensors, and after ``backward`` each pulled row's gradient is pushed
back to its table. The model itself owns only the dense MLP and a bias.

Padding: index ``N_t`` (one past the last pulled row) points at a zero row
the model appends, so a short tag list or history pools over real rows only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from feature_store.features.columns import Attention, MultiValued
from feature_store.features.schema import FeatureSchema
from feature_store.heads import HEADS
from feature_store.models.model_io import has_sequences, per_request


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
        self.attended = [
            isinstance(c, MultiValued) and c.pooling == "attention" for c in schema.embedded
        ]
        """Columns read only by an attention block (not in the deep input on their own)."""
        self.per_sequence = [per_request(c) for c in schema.embedded]
        """Columns with one index row per sequence (``S`` rows): pooled, then each batch
        row takes its sequence's (see :mod:`feature_store.models.model_io`)."""
        self.sequences = has_sequences(schema)
        self.sum_by_product = False
        """Sum pooled lists by a matrix product (set by :meth:`for_requests`)."""
        self.n_tables = len(self.tables)
        self.n_columns = len(self.columns)
        self.n_dense = len(schema.dense)
        dims = schema.table_dims()
        position = {c.name: i for i, c in enumerate(schema.embedded)}
        widths = {c.name: dims[c.table_name()] for c in schema.embedded}
        table_of = {c.name: table_pos[c.table_name()] for c in schema.embedded}
        # Drawn from a forked RNG: the global stream (and so the MLP's start, and
        # everything built after the model) is what it is without the blocks, so a
        # comparison with and without attention starts from the same network.
        with torch.random.fork_rng(devices=[]):
            self.blocks: list[AttentionBlock] = [
                AttentionBlock(block, position, widths, table_of[block.keys[0]])
                for block in schema.attention
            ]
        self.attention = nn.ModuleList(self.blocks)
        deep_in = sum(
            dims[c.table_name()]
            for c, attended in zip(schema.embedded, self.attended, strict=True)
            if not attended
        )
        deep_in += sum(block.out_dim for block in self.blocks) + self.n_dense
        self.dots = [(position[d.columns[0]], position[d.columns[1]]) for d in schema.dots]
        """Per :class:`~feature_store.features.columns.Dot`: the positions of its columns."""
        self.dot_scale = nn.Parameter(torch.tensor([d.initial_scale for d in schema.dots]))
        layers: list[nn.Module] = []
        width = deep_in
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.n_heads = len(HEADS)
        layers.append(_head_layer(width, self.n_heads))
        self.mlp = nn.Sequential(*layers)
        # Dense features arrive roughly in 0..10; a learnt affine per feature
        # keeps a large one from dominating the first layer early on.
        self.dense_norm = nn.LayerNorm(self.n_dense) if self.n_dense else nn.Identity()
        self.bias = nn.Parameter(torch.zeros(1))

    def head_logits(self, *inputs: Tensor) -> Tensor:
        """Pre-sigmoid scores of every head, shape ``(B, H)`` in :data:`HEADS` order."""
        tables = inputs[: self.n_tables]
        at = self.n_tables + self.n_columns
        indices = inputs[self.n_tables : at]
        wide_weights, wide_idx, dense = inputs[at : at + 3]
        sequence_row = inputs[at + 3] if self.sequences else None
        padded = [torch.cat([t, t.new_zeros(1, t.shape[1])], dim=0) for t in tables]
        parts: list[Tensor] = []
        gathered: list[Tensor] = []
        rows_of: list[Tensor] = []  # per embedded column, its row (pooled) per batch row
        for (table, mean), multi, attended, per_sequence, idx in zip(
            self.columns, self.multi, self.attended, self.per_sequence, indices, strict=True
        ):
            rows = padded[table][idx]
            gathered.append(rows)
            if attended:
                rows_of.append(rows)
                continue
            if multi:
                pooled = self._sum_positions(rows)
                if mean:
                    count = (idx < tables[table].shape[0]).sum(dim=1, keepdim=True)
                    pooled = pooled / count.clamp(min=1).to(pooled.dtype)
                rows = pooled
                if per_sequence and sequence_row is not None:
                    rows = rows[sequence_row]  # (S, D) pooled once per sequence -> (B, D)
            parts.append(rows)
            rows_of.append(rows)
        for block in self.blocks:
            parts.append(block(gathered, indices, tables, sequence_row))
        parts.append(self.dense_norm(dense))
        deep = self.mlp(torch.cat(parts, dim=1))
        wide = wide_weights[wide_idx].sum(dim=(1, 2))
        if self.dots:
            products = torch.stack(
                [(rows_of[a] * rows_of[b]).sum(dim=1) for a, b in self.dots], dim=1
            )
            # Not ``products @ dot_scale``: ONNX Runtime ran that (B, 3) x (3,) product
            # in 235 us for 993 rows, 8% of a request's run; the elementwise form is ~10 us.
            wide = wide + (products * self.dot_scale).sum(dim=1)
        engagement = deep[:, :1] + (wide + self.bias).unsqueeze(1)
        return torch.cat([engagement, deep[:, 1:]], dim=1)

    def logits(self, *inputs: Tensor) -> Tensor:
        """Pre-sigmoid engagement scores, shape ``(B,)``."""
        return self.head_logits(*inputs)[:, 0]

    def forward(self, *inputs: Tensor) -> Tensor:
        """Predicted probability of a positive outcome (engagement), shape ``(B,)``."""
        return torch.sigmoid(self.logits(*inputs))

    def heads(self, *inputs: Tensor) -> Tensor:
        """Every head's prediction (sigmoid of its logit), shape ``(B, H)``."""
        return torch.sigmoid(self.head_logits(*inputs))

    def for_requests(self) -> WideDeep:
        """This module switched to the forms a request runs fastest in ONNX Runtime (the
        same results): its attention blocks' :attr:`AttentionBlock.every_pair`, and
        pooled lists summed by a matrix product (:meth:`_sum_positions`). For an
        exported copy, not for training."""
        for block in self.blocks:
            block.every_pair = True
        self.sum_by_product = True
        return self

    def _sum_positions(self, rows: Tensor) -> Tensor:
        """``(N, L, D) -> (N, D)``: the sum over a list's positions. On the exported copy
        (``sum_by_product``) a ``(N, L*D) x (L*D, D)`` product with stacked identities:
        ONNX Runtime's ReduceSum over the middle axis took 150 us for 993 candidates'
        16 title tokens, the product a fraction of it."""
        if not self.sum_by_product:
            return rows.sum(dim=1)
        n, length, dim = rows.shape
        stacked = torch.eye(dim, dtype=rows.dtype).repeat(length, 1)  # (L*D, D)
        return rows.reshape(n, length * dim) @ stacked


class AttentionBlock(nn.Module):
    """One :class:`~feature_store.features.columns.Attention` of the schema.

    Shapes: the candidate side is ``(B, ...)``; the sequence side is ``(S, L, ...)``,
    one row per distinct sequence, and ``sequence_row`` ``(B,)`` says which each
    candidate reads: ``S == B`` in training (each row its own user), ``S == 1`` for
    a recommend request, whose user's keys are then projected once, not once per
    candidate (the per-candidate part is a gather and two small products).
    """

    def __init__(
        self, block: Attention, position: dict[str, int], dims: dict[str, int], key_table: int
    ) -> None:
        super().__init__()
        self.key_table = key_table
        """Position of the first key column's table among the model's tables (its row
        count tells padding from positions)."""
        self.keys = [position[n] for n in block.keys]
        self.queries = [position[n] for n in block.queries]
        self.extras = [position[n] for n in block.extras]
        key_dim = sum(dims[n] for n in block.keys)
        extra_dim = sum(dims[n] for n in block.extras)
        self.heads = block.heads
        self.head_dim = block.width // block.heads
        self.query = nn.Linear(key_dim, block.width, bias=False)
        self.key = nn.Linear(key_dim + extra_dim, block.width)
        self.value_dim = key_dim + extra_dim
        self.out_dim = self.heads * self.value_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.every_pair = False
        """Score every candidate against every sequence's positions and mask the others
        (:meth:`_every_pair`): the same result, as two plain matrix products instead of
        ``B`` small batched ones. Set on the exported copy (a request has ``S`` of 1 or
        2 sequences), never in training, where ``S == B`` would make it ``B**2``."""

    def forward(
        self,
        rows: list[Tensor],
        indices: Sequence[Tensor],
        tables: Sequence[Tensor],
        sequence_row: Tensor | None,
    ) -> Tensor:
        """``(B, heads * value_dim)``: per head, the weighted mean of the positions' rows."""
        keys = torch.cat([rows[i] for i in self.keys], dim=-1)  # (S, L, Dk)
        values = torch.cat([keys, *(rows[i] for i in self.extras)], dim=-1)  # (S, L, Dv)
        query = torch.cat([rows[i] for i in self.queries], dim=-1)  # (B, Dk)
        first = indices[self.keys[0]]  # (S, L); padding points one past the last row
        valid = (first < tables[self.key_table].shape[0]).to(values.dtype)  # (S, L)
        count = valid.sum(dim=1, keepdim=True).clamp(min=1.0)  # (S, 1)
        k = self.key(values) * valid.unsqueeze(2)  # (S, L, W), padding zeroed
        v = values * (valid / count).unsqueeze(2)  # (S, L, Dv): the mean's weights folded in
        if self.every_pair and sequence_row is not None:
            return self._every_pair(query, k, v, sequence_row)
        if sequence_row is not None:
            k, v = k[sequence_row], v[sequence_row]  # (B, L, ...)
        batch, length = query.shape[0], k.shape[1]
        q = self.query(query).reshape(batch, self.heads, 1, self.head_dim)  # (B, H, 1, d)
        k = k.reshape(batch, length, self.heads, self.head_dim).permute(0, 2, 3, 1)
        weight = torch.sigmoid(torch.matmul(q, k) * self.scale)  # (B, H, 1, L)
        pooled = torch.matmul(weight, v.unsqueeze(1))  # (B, H, 1, Dv)
        return pooled.flatten(1)

    def _every_pair(self, query: Tensor, k: Tensor, v: Tensor, sequence_row: Tensor) -> Tensor:
        """:meth:`forward`'s result computed for every (candidate, sequence) pair at once.

        The weights of a candidate's positions in sequences other than its own are
        zeroed after the sigmoid (each position's weight stands alone, nothing is
        normalised across positions), so what remains is exactly its own
        sequence's pooling. On a recommend request (``S`` of 1, or 2 with the cold
        start's anonymous rows) this is a ``(B, W) x (W, S*L)`` and a
        ``(B, S*L) x (S*L, Dv)`` product per head: ONNX Runtime spent a third of a
        500-candidate run on the batched form's gathers, transposes and tiny products.
        """
        sequences, length = k.shape[0], k.shape[1]
        batch = query.shape[0]
        q = self.query(query).reshape(batch, self.heads, self.head_dim).transpose(0, 1)
        keys = k.reshape(sequences * length, self.heads, self.head_dim).permute(1, 2, 0)
        logits = torch.matmul(q, keys) * self.scale  # (H, B, S*L)
        own = sequence_row.unsqueeze(1) == torch.arange(sequences).unsqueeze(0)  # (B, S)
        weight = torch.sigmoid(logits).reshape(self.heads, batch, sequences, length)
        # Other sequences' positions weigh 0 (a broadcast product: no mask materialised).
        weight = (weight * own.to(v.dtype).unsqueeze(2)).flatten(2)  # (H, B, S*L)
        pooled = torch.matmul(weight, v.reshape(sequences * length, -1))  # (H, B, Dv)
        return pooled.transpose(0, 1).flatten(1)


def _head_layer(width: int, heads: int) -> nn.Linear:
    """The last layer, one output per head, drawing from the global RNG what the
    single-output layer drew: the engagement row is initialised exactly as before
    heads (the same seed gives the same engagement start), and so is everything
    built after the model from the same stream (the two-tower model). The other
    rows come from a forked RNG state."""
    engagement = nn.Linear(width, 1)
    with torch.random.fork_rng(devices=[]):
        layer = nn.Linear(width, heads)
    with torch.no_grad():
        layer.weight[:1] = engagement.weight
        layer.bias[:1] = engagement.bias
        for i, head in enumerate(HEADS):
            # A rare label's head starts at its rate, not 50%: its first batches then do
            # not push the shared tower hard toward "rare" (explicit negatives are a few
            # percent of samples).
            if i and head.prior_rate is not None:
                layer.bias[i] = math.log(head.prior_rate / (1 - head.prior_rate))
    return layer


class Heads(nn.Module):
    """A :class:`WideDeep` whose forward returns one ``(B,)`` tensor per head (export)."""

    def __init__(self, model: WideDeep) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        out = self.model.heads(*inputs)
        return tuple(out[:, i] for i in range(out.shape[1]))


def upgrade_state_dict(model: WideDeep, state: dict[str, Tensor]) -> bool:
    """Grow a single-head checkpoint's last layer to ``model``'s heads, in place.

    The old output becomes the engagement row (it was trained on the same
    label); the other rows keep ``model``'s fresh initialisation. Returns
    whether anything changed (then the optimizer's state, whose moments have
    the old shapes, cannot be restored and the caller starts it afresh).
    """
    last = len(model.mlp) - 1
    weight_key, bias_key = f"mlp.{last}.weight", f"mlp.{last}.bias"
    old_w = state.get(weight_key)
    if old_w is None or old_w.shape[0] == model.n_heads:
        return False
    layer = model.mlp[last]
    assert isinstance(layer, nn.Linear)
    new_w = layer.weight.detach().clone()
    new_b = layer.bias.detach().clone()
    new_w[: old_w.shape[0]] = old_w
    new_b[: old_w.shape[0]] = state[bias_key]
    state[weight_key], state[bias_key] = new_w, new_b
    return True
