"""Matrix factorisation from a maintained library, point-in-time: the strongest classic
baseline a ranker must beat.

:class:`MatrixFactorization` is ``implicit``'s alternating least squares
(Hu, Koren and Volinsky, 2008) over the positive samples, counted as the
co-occurrence baseline counts them: each (user, video) pair once, from its
first positive sample. Asked for a user at sample index ``t`` (the samples
``[0, t)`` were trained before the moment), it scores with

- item factors fitted on the pairs before the latest refit point ``r <= t``;
  a refit happens when the pairs counted since ``r`` reach ``refit_every``
  or a tenth of those fitted on, whichever is fewer (the service's network
  is likewise exported at most ``export_every`` events before a question;
  the tenth keeps the early fits, on little data, from lasting);
- the user's factor solved at the moment, from *all* of the user's pairs
  before ``t`` (ALS's exact least-squares fold-in, the library's
  ``recalculate_user``): the user's latest views count as they do for the
  service, whose history is read at the moment.

Nothing at or after ``t`` is read. A candidate with no positive before the
refit point has no factor: it scores ``-inf`` (last; ties keep the
candidates' random order).

The algorithm and its settings were picked on a validation split
(``bench/tune_mf.py``: each user's second-to-last view, the test views
removed; ALS against BPR; figures in ``docs/benchmarks.md``), never on the
test. ``implicit`` is in the ``eval`` extra: :func:`available` says whether it
is installed, and the evaluation skips this baseline with :data:`MISSING`
when it is not.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.evaluation.metrics import Floats

MISSING = (
    "matrix factorisation baseline skipped: the 'implicit' library is not installed "
    "(pip install -e '.[eval]')"
)
"""What the evaluation reports instead of the baseline's row when the library is absent."""


def available() -> bool:
    """Whether ``implicit`` (the ``eval`` extra) can be imported."""
    return importlib.util.find_spec("implicit") is not None


@dataclass(frozen=True)
class AlsParams:
    """ALS settings; the defaults are the validation split's best (``bench/tune_mf.py``)."""

    factors: int = 32
    regularization: float = 0.1
    """L2 weight on both factor matrices."""
    alpha: float = 5.0
    """Confidence of an observed pair: ``1 + alpha`` against 1 for an unobserved one."""
    iterations: int = 15
    refit_every: int = 500
    """Positive pairs after which the item factors are fitted again (sooner while a tenth
    of those fitted on is fewer; the user's fold-in is always at the moment)."""

    def describe(self) -> str:
        return (f"ALS, {self.factors} factors, regularization {self.regularization:g}, "
                f"alpha {self.alpha:g}, {self.iterations} iterations, item factors refit "
                f"every {self.refit_every:,} positives")


def als(params: AlsParams, seed: int) -> Any:
    """An unfitted ``implicit`` CPU ALS model (the CPU one: the figures must not depend on
    whether a GPU is present)."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):  # see fit_quietly: the constructor checks it too
        return AlternatingLeastSquares(
            factors=params.factors, regularization=params.regularization, alpha=params.alpha,
            iterations=params.iterations, random_state=seed,
        )


def fit_quietly(model: Any, matrix: Any) -> None:
    """``model.fit`` with BLAS held to one thread (``implicit`` parallelises itself and
    warns, rightly, that a threaded BLAS underneath slows it down)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        model.fit(matrix, show_progress=False)


class MatrixFactorization:
    """ALS over positive pairs as of any sample index; see the module doc."""

    def __init__(
        self, user_ids: Sequence[str], video_ids: Sequence[str],
        positive: npt.NDArray[np.bool_], params: AlsParams | None = None, seed: int = 0,
    ) -> None:
        self.params = params or AlsParams()
        self.seed = seed
        self.user_code: dict[str, int] = {}
        self.item_code: dict[str, int] = {}
        users: list[int] = []
        items: list[int] = []
        at: list[int] = []
        seen: set[tuple[int, int]] = set()
        for i in np.flatnonzero(positive).tolist():
            u = self.user_code.setdefault(user_ids[i], len(self.user_code))
            v = self.item_code.setdefault(video_ids[i], len(self.item_code))
            if (u, v) not in seen:
                seen.add((u, v))
                users.append(u)
                items.append(v)
                at.append(i)
        self.users = np.asarray(users, dtype=np.int64)
        self.items = np.asarray(items, dtype=np.int64)
        self.at = np.asarray(at, dtype=np.int64)
        """Sample index of each pair's first positive, increasing."""
        order = np.argsort(self.users, kind="stable")
        starts = np.searchsorted(self.users[order], np.arange(len(self.user_code) + 1))
        self._pairs_of = [order[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]
        """Each user code's pairs (indices, ``at`` increasing): a question reads its
        user's pairs, not all of them."""
        self.fits = 0
        self._fitted_at = -1
        """Sample index the current fit was made at (-1: none yet)."""
        self._fitted_pairs = 0
        self._model: Any = None
        self._column = np.full(len(self.item_code), -1, dtype=np.int64)
        """Column of each item code in the current fit (-1: no positive before it)."""

    def _refit(self, before: int) -> None:
        import scipy.sparse as sp

        n = int(np.searchsorted(self.at, before))
        known = np.unique(self.items[:n])
        self._column = np.full(len(self.item_code), -1, dtype=np.int64)
        self._column[known] = np.arange(len(known))
        rows = np.unique(self.users[:n], return_inverse=True)[1]
        matrix = sp.csr_matrix(
            (np.ones(n, dtype=np.float32), (rows, self._column[self.items[:n]])),
            shape=(int(rows.max()) + 1 if n else 0, len(known)),
        )
        self._model = als(self.params, self.seed)
        if n:
            fit_quietly(self._model, matrix)
        self._fitted_at = before
        self._fitted_pairs = n
        self.fits += 1

    def _stale(self, before: int) -> bool:
        if self._fitted_at < 0 or before < self._fitted_at:
            return True
        new = int(np.searchsorted(self.at, before)) - self._fitted_pairs
        return new >= max(1, min(self.params.refit_every, self._fitted_pairs // 10))

    def _user_vector(self, user: str, before: int) -> Floats | None:
        import scipy.sparse as sp

        code = self.user_code.get(user)
        if code is None:
            return None
        pairs = self._pairs_of[code]
        mine = pairs[: int(np.searchsorted(self.at[pairs], before))]
        columns = self._column[self.items[mine]]
        columns = np.unique(columns[columns >= 0])
        if not len(columns):
            return None
        row = sp.csr_matrix(
            (np.ones(len(columns), dtype=np.float32), (np.zeros(len(columns)), columns)),
            shape=(1, int(self._model.item_factors.shape[0])),
        )
        return np.asarray(self._model.recalculate_user(0, row), dtype=np.float64).reshape(-1)

    def scores(self, user: str, candidates: Sequence[str], before: int) -> Floats:
        """Each candidate's score for ``user`` at sample index ``before`` (higher first;
        ``-inf`` for a video without a factor; all 0 for a user without a positive)."""
        if self._stale(before):
            self._refit(before)
        out = np.full(len(candidates), -np.inf)
        if self._model is None or not int((self._column >= 0).sum()):
            return out
        codes = np.fromiter((self.item_code.get(c, -1) for c in candidates), np.int64,
                            len(candidates))
        columns = np.where(codes >= 0, self._column[np.maximum(codes, 0)], -1)
        has = columns >= 0
        vector = self._user_vector(user, before)
        if vector is None:
            out[has] = 0.0
            return out
        factors = np.asarray(self._model.item_factors, dtype=np.float64)
        out[has] = factors[columns[has]] @ vector
        return out

    def top(self, user: str, k: int, before: int, exclude: frozenset[str]) -> list[str]:
        """The ``k`` best-scored videos with a factor, minus ``exclude`` (retrieval)."""
        videos = list(self.item_code)
        scores = self.scores(user, videos, before)
        order = np.argsort(-scores, kind="stable")
        out: list[str] = []
        for i in order.tolist():
            if not np.isfinite(scores[i]):
                break
            if videos[i] not in exclude:
                out.append(videos[i])
                if len(out) == k:
                    break
        return out
