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
test. ``implicit`` is a dependency (the trainer's live factorisation fits with
it too, ``trainer/factorization.py``): :func:`available` says whether it is
installed all the same, and the evaluation skips this baseline with :data:`MISSING`
when it is not.

Cost, and the fits run ahead: the refits are the cost (a 50,000-user log asks
50,000 questions and refits 614 times, at up to 310,000 pairs: about 980 s of
CPU, 2.6 s for the last fit), and each is a pure function of the pairs before
its point, fitted from a fresh seeded model. So :meth:`MatrixFactorization.prefitted`
works out the refit points of a sequence of questions first (which depend only
on the pair counts) and fits them in worker processes, in order, a few ahead of
the questions, from :data:`PARALLEL_FITS` fits on; the questions then read
the same item factors as when fitted one by one here (``implicit``'s solvers
treat each row on its own, so the fit does not depend on the process or its
threads; ``tests/app/test_factorization.py`` checks the ranks are the same).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.evaluation.metrics import Floats, rank_in

MISSING = (
    "matrix factorisation baseline skipped: the 'implicit' library is not installed "
    "(pip install 'implicit>=0.7.2', a dependency of the trainer)"
)
"""What the evaluation reports instead of the baseline's row when the library is absent."""


PARALLEL_FITS = 40
"""From this many refits, :meth:`MatrixFactorization.prefitted` fits in worker processes
(below, a second interpreter and its imports cost more than they save)."""


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


def als(params: AlsParams, seed: int, threads: int = 0) -> Any:
    """An unfitted ``implicit`` CPU ALS model (the CPU one: the figures must not depend on
    whether a GPU is present); ``threads``: its solver's (0: one per core; each user's and
    item's row is solved on its own, so the fit does not depend on it)."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):  # see fit_quietly: the constructor checks it too
        return AlternatingLeastSquares(
            factors=params.factors, regularization=params.regularization, alpha=params.alpha,
            iterations=params.iterations, random_state=seed, num_threads=threads,
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
        self._factors: npt.NDArray[np.float64] | None = None
        """The current fit's item factors, as the scores use them (converted once a fit)."""
        self._ahead: Iterator[tuple[int, Any]] | None = None
        """Fits made ahead (:meth:`prefitted`): ``(pairs, item factors)`` in refit order."""

    def _refit(self, before: int) -> None:
        n = int(np.searchsorted(self.at, before))
        self._column = _columns(self.items, n, len(self.item_code))
        self._model = als(self.params, self.seed)
        if n:
            if self._ahead is not None:
                at, factors = next(self._ahead)
                if at != n:
                    raise RuntimeError(f"matrix factorisation: fitted ahead at {at} pairs, "
                                       f"asked at {n} (questions out of the planned order)")
                self._model.item_factors = factors
            else:
                fit_quietly(self._model, _matrix(self.users, self.items, n, self._column))
        self._factors = (
            None if self._model.item_factors is None
            else np.asarray(self._model.item_factors, dtype=np.float64)
        )
        self._fitted_at = before
        self._fitted_pairs = n
        self.fits += 1

    def refit_points(self, befores: Sequence[int]) -> list[int]:
        """Pairs fitted on at each refit that questions at sample indices ``befores``
        (in this order) cause; computed from the counts alone, nothing is fitted."""
        fitted_at, fitted_pairs, out = -1, 0, []
        for before in befores:
            n = int(np.searchsorted(self.at, before))
            if _stale(fitted_at, fitted_pairs, before, n, self.params.refit_every):
                out.append(n)
                fitted_at, fitted_pairs = before, n
        return out

    @contextmanager
    def prefitted(self, befores: Sequence[int], workers: int | None = None) -> Iterator[None]:
        """Within, the refits of questions asked at ``befores`` (in this order) are fitted
        ahead in ``workers`` processes (None: one per core, at most 2) when there are
        :data:`PARALLEL_FITS` or more; the questions must then come in that order."""
        points = [n for n in self.refit_points(befores) if n]
        workers = workers if workers is not None else min(2, len(os.sched_getaffinity(0)))
        if workers < 1 or len(points) < PARALLEL_FITS:
            yield
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            workers, mp_context=context, initializer=_worker_init,
            initargs=(self.users, self.items, len(self.item_code), self.params, self.seed),
        ) as pool:
            self._ahead = _in_order(pool, points, 2 * workers)
            try:
                yield
            finally:
                self._ahead = None
                pool.shutdown(cancel_futures=True)

    def _stale(self, before: int) -> bool:
        n = int(np.searchsorted(self.at, before))
        return _stale(self._fitted_at, self._fitted_pairs, before, n, self.params.refit_every)

    def _user_items(self, user: str, before: int) -> npt.NDArray[np.int64] | None:
        """Item codes of ``user``'s pairs before sample index ``before`` (None: a user
        without a positive in the whole stream)."""
        code = self.user_code.get(user)
        if code is None:
            return None
        pairs = self._pairs_of[code]
        return self.items[pairs[: int(np.searchsorted(self.at[pairs], before))]]

    def scores(self, user: str, candidates: Sequence[str], before: int) -> Floats:
        """Each candidate's score for ``user`` at sample index ``before`` (higher first;
        ``-inf`` for a video without a factor; all 0 for a user without a positive)."""
        if self._stale(before):
            self._refit(before)
        codes = np.fromiter((self.item_code.get(c, -1) for c in candidates), np.int64,
                            len(candidates))
        return fold_in_scores(self._model, self._factors, self._column, codes,
                              self._user_items(user, before))

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


Question = tuple[str, tuple[str, ...], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]
"""A question as a fit answers it: ``(video, candidates, their item codes (-1: no positive
yet), the user's pairs' item codes so far (None: none))``."""


class RanksAhead:
    """The baseline's leave-one-out ranks worked out during the replay, in a worker process.

    The replay hands in its weighted samples as it trains them (:meth:`add`) and each
    question as it asks it (:meth:`ask`): everything a question's ranks read (the pairs
    before it, the refit point, the user's pairs) is known then, and nothing the online
    model does changes it. The questions between two refit points go to the worker as one
    task (fit on the pairs before the first of them, then each user's fold-in), at most
    two tasks queued at a time; :meth:`ranks` waits for the last. The codes are assigned in
    the order :class:`MatrixFactorization` assigns them over the whole stream, the refit
    points are its (:func:`_stale`) and the scores its (:func:`fold_in_scores`), so the
    ranks are the ones it gives after the replay (``tests/app/test_factorization.py``).
    """

    def __init__(self, params: AlsParams | None = None, seed: int = 0, threads: int = 1) -> None:
        self.params = params or AlsParams()
        self.seed = seed
        self.threads = threads
        self.user_code: dict[str, int] = {}
        self.item_code: dict[str, int] = {}
        self._pairs: set[tuple[int, int]] = set()
        self._users = np.zeros(1024, dtype=np.int32)
        self._items = np.zeros(1024, dtype=np.int32)
        self._n = 0
        self._user_items: dict[int, list[int]] = {}
        self._fitted_at = -1
        self._fitted_pairs = 0
        self._segment: tuple[int, list[Question]] | None = None
        self._waiting: deque[tuple[int, list[Question]]] = deque()
        self._running: deque[Future[list[int]]] = deque()
        self._ranks: list[int] = []
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def add(self, user_ids: Sequence[str], video_ids: Sequence[str],
            positive: npt.NDArray[np.bool_]) -> None:
        """Samples trained (weighted ones, in order); a (user, video) pair counts from its
        first positive."""
        for i in np.flatnonzero(positive).tolist():
            u = self.user_code.setdefault(user_ids[i], len(self.user_code))
            v = self.item_code.setdefault(video_ids[i], len(self.item_code))
            if (u, v) in self._pairs:
                continue
            self._pairs.add((u, v))
            if self._n == len(self._users):
                self._users = np.concatenate([self._users, np.zeros_like(self._users)])
                self._items = np.concatenate([self._items, np.zeros_like(self._items)])
            self._users[self._n], self._items[self._n] = u, v
            self._n += 1
            self._user_items.setdefault(u, []).append(v)

    def ask(self, before: int, user: str, video: str, candidates: Sequence[str]) -> None:
        """A question at sample index ``before`` (every sample added so far is before it)."""
        n = self._n
        if _stale(self._fitted_at, self._fitted_pairs, before, n, self.params.refit_every):
            if self._segment is not None:
                self._waiting.append(self._segment)
            self._segment = (n, [])
            self._fitted_at, self._fitted_pairs = before, n
        assert self._segment is not None
        code = self.user_code.get(user)
        mine = None if code is None else np.asarray(self._user_items[code], dtype=np.int64)
        codes = np.fromiter((self.item_code.get(c, -1) for c in candidates), np.int64,
                            len(candidates))
        self._segment[1].append((video, tuple(candidates), codes, mine))
        self._submit(2)

    def _submit(self, queued: int) -> None:
        """Hand waiting tasks to the worker while fewer than ``queued`` are in its hands."""
        while self._waiting and len(self._running) < queued:
            n, questions = self._waiting.popleft()
            self._running.append(self._pool.submit(
                _segment_ranks, self._users[:n].copy(), self._items[:n].copy(),
                len(self.item_code), self.params, self.seed, self.threads, questions,
            ))
        while self._running and self._running[0].done():
            self._ranks += self._running.popleft().result()

    def ranks(self) -> list[int]:
        """Every question's rank, in the order asked (waits for the worker)."""
        if self._segment is not None:
            self._waiting.append(self._segment)
            self._segment = None
        while self._waiting or self._running:
            self._submit(2)
            if self._running:
                self._ranks += self._running.popleft().result()
        return self._ranks

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def _segment_ranks(
    users: npt.NDArray[np.int32], items: npt.NDArray[np.int32], n_items: int,
    params: AlsParams, seed: int, threads: int, questions: list[Question],
) -> list[int]:
    """The ranks of ``questions``, by a fit on the pairs ``(users, items)`` (in a worker)."""
    n = len(users)
    column = _columns(items.astype(np.int64), n, n_items)
    model = als(params, seed, threads)
    if n:
        fit_quietly(model, _matrix(users.astype(np.int64), items.astype(np.int64), n, column))
    factors = None if model.item_factors is None else np.asarray(model.item_factors, np.float64)
    return [
        rank_in(video, candidates, fold_in_scores(model, factors, column, codes, mine))
        for video, candidates, codes, mine in questions
    ]


def fold_in_scores(
    model: Any, factors: npt.NDArray[np.float64] | None, column: npt.NDArray[np.int64],
    codes: npt.NDArray[np.int64], user_items: npt.NDArray[np.int64] | None,
) -> Floats:
    """Scores of the candidates of item ``codes`` (-1: no positive yet) by a fit whose
    columns are ``column``, for a user with pairs of ``user_items`` before the moment (None:
    none): the user's factor solved from those of them the fit knows (``-inf`` for a
    candidate without a factor; all 0 for a user without a known item)."""
    import scipy.sparse as sp

    out = np.full(len(codes), -np.inf)
    if model is None or factors is None or not int((column >= 0).sum()):
        return out
    columns = np.where(codes >= 0, column[np.maximum(codes, 0)], -1)
    has = columns >= 0
    known = None if user_items is None else column[user_items]
    known = None if known is None else np.unique(known[known >= 0])
    if known is None or not len(known):
        out[has] = 0.0
        return out
    row = sp.csr_matrix(
        (np.ones(len(known), dtype=np.float32), (np.zeros(len(known)), known)),
        shape=(1, int(model.item_factors.shape[0])),
    )
    vector = np.asarray(model.recalculate_user(0, row), dtype=np.float64).reshape(-1)
    out[has] = factors[columns[has]] @ vector
    return out


def _stale(fitted_at: int, fitted_pairs: int, before: int, n: int, refit_every: int) -> bool:
    """Whether a question at sample index ``before`` (``n`` pairs before it) refits."""
    if fitted_at < 0 or before < fitted_at:
        return True
    return n - fitted_pairs >= max(1, min(refit_every, fitted_pairs // 10))


def _columns(items: npt.NDArray[np.int64], n: int, n_items: int) -> npt.NDArray[np.int64]:
    """Column of each item code in a fit on the first ``n`` pairs (-1: not among them)."""
    known = np.unique(items[:n])
    column = np.full(n_items, -1, dtype=np.int64)
    column[known] = np.arange(len(known))
    return column


def _matrix(users: npt.NDArray[np.int64], items: npt.NDArray[np.int64], n: int,
            column: npt.NDArray[np.int64]) -> Any:
    """The (user, item) matrix of the first ``n`` pairs, in fit columns."""
    import scipy.sparse as sp

    rows = np.unique(users[:n], return_inverse=True)[1]
    return sp.csr_matrix(
        (np.ones(n, dtype=np.float32), (rows, column[items[:n]])),
        shape=(int(rows.max()) + 1 if n else 0, int((column >= 0).sum())),
    )


_WORKER: dict[str, Any] = {}
"""A fitting process's pairs and settings (:func:`_worker_init`)."""


def _worker_init(users: npt.NDArray[np.int64], items: npt.NDArray[np.int64], n_items: int,
                 params: AlsParams, seed: int) -> None:
    _WORKER.update(users=users, items=items, n_items=n_items, params=params, seed=seed)


def _fit_factors(n: int) -> tuple[int, Any]:
    """``(n, item factors)`` of a fit on the first ``n`` pairs (in a worker)."""
    users, items = _WORKER["users"], _WORKER["items"]
    model = als(_WORKER["params"], _WORKER["seed"])
    fit_quietly(model, _matrix(users, items, n, _columns(items, n, _WORKER["n_items"])))
    return n, model.item_factors


def _in_order(pool: ProcessPoolExecutor, points: Sequence[int], ahead: int
              ) -> Iterator[tuple[int, Any]]:
    """The fits of ``points`` in order, at most ``ahead`` submitted and not yet taken."""
    pending: deque[Future[tuple[int, Any]]] = deque()
    upcoming = iter(points)
    for n in upcoming:
        pending.append(pool.submit(_fit_factors, n))
        if len(pending) >= ahead:
            break
    while pending:
        done = pending.popleft().result()
        nxt = next(upcoming, None)
        if nxt is not None:
            pending.append(pool.submit(_fit_factors, nxt))
        yield done
