"""The factors of the trainer's live matrix factorisation (``trainer/factorization.py``).

A *fit* is a version: every known video's factor (one matrix) and every fitted
user's factor, published together because two fits' factors live in
different bases (a user's factor means nothing against another fit's
videos). Between fits the trainer folds each user in again at their new
positives (one ``k x k`` solve against the current fit's videos) and writes
that user's row into the current version: a user's own actions move their
factor within a batch, without waiting for an export.

The service reads the newest version's video factors (cached per version)
and the asking user's row at each request (``app/scoring/factorization.py``).
Factors are float32, ``dim`` wide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ItemFactors:
    """One fit's video factors: row ``i`` is the factor of ``ids[i]``."""

    version: int
    ids: tuple[str, ...]
    vectors: Vectors
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.vectors.shape[0] != len(self.ids):
            raise ValueError(f"{len(self.ids)} ids for {self.vectors.shape[0]} factors")
        object.__setattr__(self, "index", {v: i for i, v in enumerate(self.ids)})

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def rows(self, video_ids: Sequence[str]) -> npt.NDArray[np.int64]:
        """Row of each video (-1: no factor in this fit)."""
        return np.fromiter(map(self.index.get, video_ids, repeat(-1)), np.int64, len(video_ids))


class FactorStore(Protocol):
    """Where the trainer publishes fits and fold-ins and the service reads them."""

    def publish(self, ids: Sequence[str], vectors: Vectors, users: Sequence[str],
                user_vectors: Vectors) -> int:
        """A new fit (video factors and every fitted user's); returns its version
        (greater than every earlier one). The previous version's users stop being read."""
        ...

    def fold(self, version: int, users: Sequence[str], user_vectors: Vectors) -> None:
        """Users' factors solved again against fit ``version``'s videos (ignored when a
        newer fit replaced it meanwhile)."""
        ...

    def read(self, user_id: str) -> tuple[ItemFactors | None, Vectors | None]:
        """The newest fit's video factors and ``user_id``'s factor in it (None: no fit
        yet; a user without one)."""
        ...

    def ping(self) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...
