"""Stable 64-bit feature keys.

A (key space, value) pair maps to ``xxh3_64(space + "\\x1f" + value)``: the
same 64-bit key in every process, on every machine, across Python versions
(Python's ``hash()`` is salted per process and must never be used here).
The key space is usually the column's name, so ``user=42`` and ``video=42``
are different keys; columns that should share rows (a video and the videos
in a history) share a key space.

Crossed features combine their parts' keys with integer mixing
(:func:`cross_keys`), which is as stable as the hash and vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import xxhash

Keys = npt.NDArray[np.uint64]

_SEPARATOR = "\x1f"
_MASK64 = (1 << 64) - 1


def feature_key(space: str, value: str) -> int:
    """The 64-bit key of ``value`` in key space ``space``."""
    return xxhash.xxh3_64_intdigest(f"{space}{_SEPARATOR}{value}".encode())


class KeyHasher:
    """Hashes many values of one key space, remembering recent ones.

    Ids repeat heavily in a stream (popular videos, active users), so a
    bounded dict in front of xxhash roughly halves the cost per batch. When
    the cache passes ``max_entries`` it is emptied (cheap, and correctness
    never depends on it).
    """

    def __init__(self, space: str, max_entries: int = 200_000) -> None:
        self.space = space
        self.max_entries = max_entries
        self._cache: dict[str, int] = {}

    def hash_many(self, values: Sequence[str]) -> Keys:
        cache = self._cache
        out = np.fromiter(map(cache.get, values, _zeros(len(values))), np.uint64, len(values))
        missing = np.flatnonzero(out == 0)
        if missing.size:
            if len(cache) + missing.size > self.max_entries:
                cache.clear()
            space = self.space
            for i in missing.tolist():
                value = values[i]
                key = feature_key(space, value) or 1  # 0 marks "not cached"; collide on 1
                cache[value] = key
                out[i] = key
        return out


def _zeros(n: int) -> list[int]:
    return [0] * n


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(x: Keys) -> Keys:
    """The splitmix64 finaliser, elementwise: a fast bijective 64-bit mix (a new array).

    Wraps modulo 2**64 as intended. numpy warns about integer overflow only
    for scalars, never for arrays, so a 0-d ``x`` is made 1-d instead of
    paying for ``np.errstate`` on every call (a serving request mixes a dozen
    small arrays).
    """
    z = np.array(x, dtype=np.uint64, ndmin=1)
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


def splitmix64(x: Keys) -> Keys:
    """One splitmix64 step, elementwise: :func:`mix64` of ``x`` plus the golden gamma."""
    return mix64(np.asarray(x, dtype=np.uint64) + _GOLDEN)


@lru_cache(maxsize=1024)
def _cross_seed(name: str) -> np.uint64:
    return np.uint64(feature_key("cross", name) & _MASK64)


def cross_keys(name: str, parts: Sequence[Keys]) -> Keys:
    """Keys of a crossed feature from its parts' keys.

    ``mix(mix(seed ^ k1) ^ k2) ...`` with the cross's name as seed: order
    matters, and the result is independent of the parts' own key spaces
    colliding with the cross's. Parts have one length, or length 1 for a
    part shared by every row (broadcast): the serving path crosses a request's
    one user key with each distinct video key this way. The one crossing
    function of the project: training and serving both call it.
    """
    n = max(len(p) for p in parts)
    acc = np.full(n, _cross_seed(name), dtype=np.uint64)
    for part in parts:
        acc = splitmix64(acc ^ part)
    return acc
