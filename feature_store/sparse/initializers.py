"""Deterministic initial rows: a pure function of (key, table seed, column).

Several trainer processes may admit the same key at the same moment (one per
partition of the event log, or a restarted trainer re-admitting an expired
key). If each drew its initial row from its own random generator, the row
would depend on which process won; worse, a process that pulled a row it
initialised itself would train against values another process overwrote. So
the initial value of column ``j`` of key ``k`` in a table is computed, not
drawn::

    seed   = first 8 bytes of blake2b(table name)            (uint64)
    base   = mix64(k xor seed)
    bits_j = mix64(base + (j + 1) * 0x9E3779B97F4A7C15)
    u_j    = (bits_j >> 40) / 2**24                          in [0, 1), exact in float32
    row_j  = (2 * u_j - 1) * init_scale                      in [-init_scale, init_scale)

``mix64`` (:func:`feature_store.features.keys.mix64`), the finaliser of
splitmix64 (Steele et al. 2014, the seeding generator of xoshiro), is a
bijective 64-bit mixer with good avalanche, cheap to vectorize in numpy
(uint64 arithmetic wraps modulo 2**64). Column ``j`` does not depend on
``dim``, so a row of a wider table starts with the row of a narrower one.

Wide (FTRL) rows start at 0 (see :attr:`SparseOptimizer.zero_init`); the
serving default of a row that does not exist is zeros, never this function.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from feature_store.features.keys import mix64
from feature_store.sparse.base import Keys, Rows

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_S40 = np.uint64(40)


def table_seed(name: str) -> int:
    """Stable 64-bit seed of a table name (the same in every process and release)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def uniform_rows(keys: Keys, seed: int, dim: int, scale: float) -> Rows:
    """Rows ``(len(keys), dim)`` float32, uniform in ``[-scale, scale)``, fixed by key and seed."""
    keys = np.asarray(keys, dtype=np.uint64)
    base = mix64(keys ^ np.uint64(seed))
    counters = (np.arange(1, dim + 1, dtype=np.uint64) * _GAMMA)[None, :]
    bits = mix64(base[:, None] + counters)
    unit = (bits >> _S40).astype(np.float32) * np.float32(2.0**-24)
    return ((unit * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)).astype(np.float32)


class Initializer:
    """Initial weights of new rows of one table."""

    def __init__(
        self,
        table_name: str,
        dim: int,
        scale: float,
        zero: bool,
        preset: Mapping[int, Rows] | None = None,
    ) -> None:
        self.seed = table_seed(table_name)
        self.dim = dim
        self.scale = scale
        self.zero = zero
        """FTRL tables start at 0: the wide part begins as 'no opinion'."""
        self.preset = preset or {}
        """Rows some keys start from instead (pretrained word vectors: the same in every
        process that read the same file, so the rule above still holds)."""

    def __call__(self, keys: Keys) -> Rows:
        if self.zero or self.scale == 0.0:
            return np.zeros((len(keys), self.dim), dtype=np.float32)
        rows = uniform_rows(keys, self.seed, self.dim, self.scale)
        if self.preset:
            for i, key in enumerate(keys.tolist()):
                found = self.preset.get(key)
                if found is not None:
                    rows[i] = found
        return rows
