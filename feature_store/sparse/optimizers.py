"""Per-row optimizers of the sparse tables, vectorized over a batch of rows.

A push hands an optimizer the weights and state of the rows it touches
(``weights`` ``(n, dim)``, ``state`` ``(n, state_width(dim))``, both float32)
and one gradient row per key; it returns the new weights and state. Rows are
independent, so the same code serves the memory and Redis backends, and a
row's state is a flat float32 vector that either backend stores as it is.

Why per-row optimizers: a key that appears once a week must not share an
update schedule with a key seen every batch. Adagrad and Adam adapt each
weight's step to that weight's own gradient history; FTRL-Proximal does the
same for the wide (linear) part and produces exact zeros through L1, which
keeps the wide model sparse.

All arithmetic is float32 like the stored rows (float64 would double the
memory traffic of a push for no gain at these step sizes). Hyperparameters
come from :class:`feature_store.settings.SparseSettings`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from feature_store.errors import ConfigurationError, InvalidInput
from feature_store.settings import SparseSettings
from feature_store.sparse.base import Keys, OptimizerName, Rows


class SparseOptimizer(Protocol):
    """What a table needs from an optimizer."""

    name: OptimizerName
    zero_init: bool
    """True when a new row's weights start at 0 (FTRL) instead of the random initializer."""

    def state_width(self, dim: int) -> int:
        """Float32 values of optimizer state per row of ``dim`` weights."""
        ...

    def initial_state(self, n: int, dim: int) -> Rows:
        """State of ``n`` new rows, shape ``(n, state_width(dim))``."""
        ...

    def apply(self, weights: Rows, state: Rows, grads: Rows) -> tuple[Rows, Rows]:
        """New ``(weights, state)`` after one gradient row per row; inputs are not modified."""
        ...


def _f32(x: float) -> np.float32:
    return np.float32(x)


class Adagrad:
    """Adagrad (Duchi et al. 2011) with an initial accumulator, as in Keras.

    State: the accumulator ``a`` (one per weight, ``state_width = dim``),
    starting at ``adagrad_initial_accumulator``. For each weight::

        a <- a + g**2
        w <- w - lr * g / (sqrt(a) + eps)

    The initial accumulator damps the first steps of a fresh row (with
    ``a = 0`` the first step would be ``lr * sign(g)`` whatever ``|g|``).
    """

    name: OptimizerName = "adagrad"
    zero_init = False

    def __init__(self, settings: SparseSettings) -> None:
        self.lr = _f32(settings.learning_rate)
        self.eps = _f32(settings.epsilon)
        self.initial_accumulator = _f32(settings.adagrad_initial_accumulator)

    def state_width(self, dim: int) -> int:
        return dim

    def initial_state(self, n: int, dim: int) -> Rows:
        return np.full((n, dim), self.initial_accumulator, dtype=np.float32)

    def apply(self, weights: Rows, state: Rows, grads: Rows) -> tuple[Rows, Rows]:
        acc = state + grads * grads
        new_weights = weights - self.lr * grads / (np.sqrt(acc) + self.eps)
        return new_weights.astype(np.float32, copy=False), acc


class Adam:
    """Adam (Kingma & Ba 2015) with a step count per row for bias correction.

    State per row: ``m`` (dim), ``v`` (dim) and ``t`` (1): ``state_width =
    2 * dim + 1``, laid out ``[m | v | t]``. Each row counts its own steps,
    because a rare key's first update must get the full bias correction
    however many batches the table has seen. For each weight::

        t <- t + 1
        m <- b1 * m + (1 - b1) * g
        v <- b2 * v + (1 - b2) * g**2
        w <- w - lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)

    ``t`` is stored as float32, exact up to 2**24 (16.7 million) updates of
    one row; beyond that the bias corrections are 1 to float32 precision
    anyway, so the rounding of ``t`` changes nothing.
    """

    name: OptimizerName = "adam"
    zero_init = False

    def __init__(self, settings: SparseSettings) -> None:
        self.lr = _f32(settings.learning_rate)
        self.b1 = _f32(settings.adam_beta1)
        self.b2 = _f32(settings.adam_beta2)
        self.eps = _f32(settings.epsilon)

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1

    def initial_state(self, n: int, dim: int) -> Rows:
        return np.zeros((n, 2 * dim + 1), dtype=np.float32)

    def apply(self, weights: Rows, state: Rows, grads: Rows) -> tuple[Rows, Rows]:
        dim = weights.shape[1]
        m = state[:, :dim]
        v = state[:, dim : 2 * dim]
        t = state[:, 2 * dim :] + _f32(1.0)
        m = self.b1 * m + (_f32(1.0) - self.b1) * grads
        v = self.b2 * v + (_f32(1.0) - self.b2) * (grads * grads)
        m_hat = m / (_f32(1.0) - np.power(self.b1, t))
        v_hat = v / (_f32(1.0) - np.power(self.b2, t))
        new_weights = weights - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return new_weights, np.concatenate((m, v, t), axis=1)


class Ftrl:
    """FTRL-Proximal (McMahan et al. 2013, "Ad Click Prediction", Algorithm 1).

    State per row: ``z`` (dim) and ``n`` (dim), laid out ``[z | n]``
    (``state_width = 2 * dim``), both starting at 0 like the weights. The
    weights are a function of the state; they are stored anyway so that
    serving reads only weights. For each weight, with ``alpha``, ``beta``,
    ``l1``, ``l2`` from the settings::

        sigma <- (sqrt(n + g**2) - sqrt(n)) / alpha
        z     <- z + g - sigma * w
        n     <- n + g**2
        w     <- 0                                              if |z| <= l1
                 -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise
    """

    name: OptimizerName = "ftrl"
    zero_init = True

    def __init__(self, settings: SparseSettings) -> None:
        self.alpha = _f32(settings.ftrl_alpha)
        self.beta = _f32(settings.ftrl_beta)
        self.l1 = _f32(settings.ftrl_l1)
        self.l2 = _f32(settings.ftrl_l2)

    def state_width(self, dim: int) -> int:
        return 2 * dim

    def initial_state(self, n: int, dim: int) -> Rows:
        return np.zeros((n, 2 * dim), dtype=np.float32)

    def apply(self, weights: Rows, state: Rows, grads: Rows) -> tuple[Rows, Rows]:
        dim = weights.shape[1]
        z = state[:, :dim]
        n = state[:, dim:]
        g2 = grads * grads
        new_n = n + g2
        sqrt_new_n = np.sqrt(new_n)
        sigma = (sqrt_new_n - np.sqrt(n)) / self.alpha
        z = (z + grads - sigma * weights).astype(np.float32, copy=False)
        shrunk = z - np.sign(z) * self.l1
        new_weights = -shrunk / ((self.beta + sqrt_new_n) / self.alpha + self.l2)
        new_weights = np.where(np.abs(z) <= self.l1, _f32(0.0), new_weights).astype(np.float32)
        return new_weights, np.concatenate((z, new_n), axis=1)


def make_optimizer(name: OptimizerName, settings: SparseSettings) -> SparseOptimizer:
    """The optimizer called ``name``, configured from ``settings``."""
    if name == "adagrad":
        return Adagrad(settings)
    if name == "adam":
        return Adam(settings)
    if name == "ftrl":
        return Ftrl(settings)
    raise ConfigurationError(f"unknown sparse optimizer {name!r} (adagrad, adam or ftrl)")


# --- Batch checks shared by every backend ---------------------------------


def as_keys(keys: object) -> Keys:
    """``keys`` as a 1-D uint64 array (no copy when it already is one)."""
    array = np.asarray(keys)
    if array.ndim != 1:
        raise InvalidInput("keys", f"must be 1-D, got shape {array.shape}")
    if array.dtype != np.uint64:
        if array.size and array.dtype.kind not in "iu":
            raise InvalidInput("keys", f"must be integers, got {array.dtype}")
        if array.dtype.kind == "i" and array.size and int(array.min()) < 0:
            raise InvalidInput("keys", "negative key; keys are uint64")
        array = array.astype(np.uint64)
    return array


def as_grads(grads: object, n: int, dim: int) -> Rows:
    """``grads`` as a float32 ``(n, dim)`` array of finite values.

    A non-finite gradient would turn a row (and its optimizer state) into NaN
    for good, so a batch holding one is refused whole: it nearly always means
    the loss of that batch diverged, and its other gradients are suspect too.
    """
    array = np.asarray(grads, dtype=np.float32)
    if array.shape != (n, dim):
        raise InvalidInput("grads", f"shape {array.shape}, want ({n}, {dim}) (one row per key)")
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).any(axis=1).sum())
        raise InvalidInput("grads", f"{bad} of {n} gradient rows hold NaN or inf; batch refused")
    return array
