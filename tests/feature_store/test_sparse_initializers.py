"""The initializer is a fixed formula: pinned here against an independent scalar version."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from feature_store.sparse.initializers import Initializer, table_seed, uniform_rows

M64 = 2**64 - 1


def splitmix64(x: int) -> int:
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def scalar_row(key: int, name: str, dim: int, scale: float) -> list[float]:
    seed = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
    base = splitmix64(key ^ seed)
    row = []
    for j in range(dim):
        bits = splitmix64(base + (j + 1) * 0x9E3779B97F4A7C15)
        unit = (bits >> 40) / 2**24
        row.append((2 * unit - 1) * scale)
    return row


@pytest.mark.parametrize("key", [0, 1, 12345, 2**63, 2**64 - 1])
def test_matches_the_documented_formula(key: int) -> None:
    got = uniform_rows(np.array([key], dtype=np.uint64), table_seed("video_emb"), 16, 0.05)
    np.testing.assert_allclose(got[0], scalar_row(key, "video_emb", 16, 0.05), rtol=1e-6, atol=1e-9)


def test_deterministic_bounded_and_table_specific() -> None:
    keys = np.arange(10_000, dtype=np.uint64)
    a = Initializer("emb", 32, 0.1, zero=False)(keys)
    b = Initializer("emb", 32, 0.1, zero=False)(keys)
    assert a.dtype == np.float32 and a.shape == (10_000, 32)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -0.1 and a.max() < 0.1
    assert (
        abs(float(a.mean())) < 0.002 and 0.05 < float(a.std()) < 0.065
    )  # uniform: scale / sqrt(3)
    other = Initializer("emb2", 32, 0.1, zero=False)(keys)
    assert not np.isclose(a, other).all()
    # A narrower table's row is the start of a wider one's.
    np.testing.assert_array_equal(Initializer("emb", 8, 0.1, zero=False)(keys), a[:, :8])


def test_zero_initializer_for_wide_rows() -> None:
    rows = Initializer("wide", 1, 0.05, zero=True)(np.arange(5, dtype=np.uint64))
    assert rows.shape == (5, 1) and not rows.any()
