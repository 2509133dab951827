"""The live matrix factorisation: implicit ALS over the users' chosen videos, kept current.

Why: on ml-100k's leave-one-out, point in time, ALS's score fused into the
ranking was the only signal measured to take HR@10 past 0.65 (0.6352 to 0.6617,
``bench/als_signal_screen.py``), and only with the video factors refit every
few hundred positives and each user solved from their whole history at the
moment: at the exports' cadence, or from the newest 50 views, most of the gain
went (``docs/benchmarks.md``, *A factorisation's score as a ranking signal*).
So these factors skip the exports: they go to the factor store
(:mod:`feature_store.factors`) as they are made, and the service reads them at
each request.

What it does, on the views the sequence stage keeps (:class:`trainer.sequence.SequenceTrainer`:
each user's chosen videos, one entry per video):

- a *fit* (``implicit``'s CPU ALS: Hu, Koren and Volinsky 2008) of every
  user and video when the pairs kept grew by ``min(refit_every, a tenth of
  those fitted on)`` (at least ``min_refit``) since the last, published as a
  new version of the store: the first from scratch (seeded, ``iterations``),
  each later one ``warm_iterations`` from the previous fit's factors (a new
  user or video starts as in a fresh fit);
- between fits, every user given a view since the last step is *folded in*
  again: their factor solved against the current fit's videos from all their
  views (ALS's exact least-squares step, ``recalculate_user``), written into
  the current version.

A video first chosen after the newest fit has no factor until the next one
(the service ranks it as the request's lowest on this term).

Where it runs: :meth:`LiveFactorization.step` on the sequence stage's
factorisation thread online (fits at most every ``refit_interval_s``), or on
the trainer's thread after each batch in the evaluation's replay (counted by
pairs alone, so every figure is reproducible and point in time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from feature_store.errors import BackendUnavailable
from feature_store.factors.base import FactorStore
from feature_store.settings import FactorizationSettings

if TYPE_CHECKING:
    from trainer.sequence import SequenceTrainer

log = logging.getLogger(__name__)


def _matrix(rows: Sequence[np.ndarray], columns: int) -> Any:
    """The (row, column) matrix of ``rows[i]``'s columns, ones (``scipy`` CSR, float32)."""
    import scipy.sparse as sp

    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    data = np.ones(len(indices), np.float32)
    return sp.csr_matrix((data, indices, indptr), shape=(len(rows), columns))


class LiveFactorization:
    """The fits and fold-ins of the users' views (see the module doc).

    ``views``: the sequence stage's trainer, whose views and codes it reads;
    ``store``: where fits and fold-ins go."""

    def __init__(self, settings: FactorizationSettings, views: SequenceTrainer,
                 store: FactorStore, seed: int = 0) -> None:
        self.settings = settings
        self.views = views
        self.store = store
        self.seed = seed
        self.fits = 0
        self.fitted_pairs = 0
        """Pairs (user, video) the newest published fit was made on."""
        self.folded = 0
        """Users folded in since the start."""
        self.failed = 0
        """Fits and fold-ins that failed (the store unreachable, or a bug)."""
        self.fit_seconds = 0.0
        self.version: int | None = None
        """The store's version of the newest fit this process published."""
        self._model: Any = None
        self._column = np.zeros(0, np.int64)
        """Column of each sequence code in the newest fit (-1: not in it)."""
        self._user_row: dict[str, int] = {}
        """Row of each user in the newest fit."""
        self._fit_started = -float("inf")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the schedule ---------------------------------------------------------------

    def due(self) -> bool:
        """Whether the pairs kept grew enough since the newest fit for another."""
        s = self.settings
        every = max(s.min_refit, min(s.refit_every, self.fitted_pairs // 10))
        return self.views.kept - self.fitted_pairs >= every

    def step(self, paced: bool = False) -> None:
        """A fit when one is due (``paced``: and ``refit_interval_s`` passed since the
        last started), else the fold-ins of the users given views since the last step.
        A failure is counted and logged; the next step tries again."""
        try:
            ready = not paced or (
                time.monotonic() - self._fit_started >= self.settings.refit_interval_s)
            if self.due() and ready:
                self.fit()
            else:
                self.fold_touched()
        except BackendUnavailable as exc:
            self.failed += 1
            log.warning("factorization step failed (%d so far): %s", self.failed, exc)
        except Exception:  # a bug must cost this term, not the trainer
            self.failed += 1
            log.exception("factorization step failed (%d so far)", self.failed)

    # --- fits and fold-ins -----------------------------------------------------------

    def fit(self) -> bool:
        """Fit every user and video on the views now; publish. False: nothing to fit."""
        from threadpoolctl import threadpool_limits

        self._fit_started = time.monotonic()
        ids, users, rows = self.views.all_views()
        if not users:
            return False
        pairs = sum(map(len, rows))
        known = np.unique(np.concatenate(rows))
        column = np.full(len(ids) + 1, -1, np.int64)
        column[known] = np.arange(len(known))
        model = self._new_model(warm=self._model is not None)
        if self._model is not None:
            model.item_factors, model.user_factors = self._warm_start(known, users)
        with threadpool_limits(1, "blas"):  # implicit warns, rightly, of a threaded BLAS
            model.fit(_matrix([column[r] for r in rows], len(known)), show_progress=False)
        items = np.asarray(model.item_factors, np.float32)
        version = self.store.publish([ids[c - 1] for c in known.tolist()], items, users,
                                     np.asarray(model.user_factors, np.float32))
        self._model, self._column, self.version = model, column, version
        self._user_row = {u: i for i, u in enumerate(users)}
        self.fits += 1
        self.fitted_pairs = pairs
        self.fit_seconds = time.monotonic() - self._fit_started
        return True

    def _new_model(self, warm: bool) -> Any:
        from implicit.cpu.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits

        s = self.settings
        with threadpool_limits(1, "blas"):  # the constructor checks it too
            return AlternatingLeastSquares(
                factors=s.factors, regularization=s.regularization, alpha=s.alpha,
                iterations=s.warm_iterations if warm else s.iterations,
                random_state=self.seed, num_threads=1,
            )

    def _warm_start(self, known: np.ndarray, users: Sequence[str]) -> tuple[Any, Any]:
        """The newest fit's factors of the videos (sequence ``known`` codes) and ``users``
        of the next, where it had them; the others start as a fresh fit's do (uniform in
        ``[0, 0.01)``, seeded)."""
        rng = np.random.default_rng((self.seed, self.fits))
        k = self.settings.factors
        old_items = np.asarray(self._model.item_factors, np.float32)
        old_users = np.asarray(self._model.user_factors, np.float32)
        items = rng.random((len(known), k), dtype=np.float32) * 0.01
        before = self._column[np.minimum(known, len(self._column) - 1)]
        had = (known < len(self._column)) & (before >= 0)
        items[had] = old_items[before[had]]
        rows = np.fromiter(map(self._user_row.get, users, repeat(-1)), np.int64, len(users))
        factors = rng.random((len(users), k), dtype=np.float32) * 0.01
        factors[rows >= 0] = old_users[rows[rows >= 0]]
        return items, factors

    def fold_touched(self) -> int:
        """Solve again the factor of every user given a view since the last call, against
        the newest fit's videos, and write them; returns how many."""
        users, rows = self.views.take_touched()
        if self._model is None or self.version is None or not users:
            return 0
        column = self._column
        kept_users, kept_rows = [], []
        for user, codes in zip(users, rows, strict=True):
            mine = column[codes[codes < len(column)]]
            mine = mine[mine >= 0]
            if len(mine):
                kept_users.append(user)
                kept_rows.append(mine)
        if not kept_users:
            return 0
        from threadpoolctl import threadpool_limits

        matrix = _matrix(kept_rows, int(self._model.item_factors.shape[0]))
        with threadpool_limits(1, "blas"):
            factors = self._model.recalculate_user(np.arange(len(kept_users)), matrix)
        try:
            self.store.fold(self.version, kept_users, np.asarray(factors, np.float32))
        except BackendUnavailable:
            self.views.retouch(kept_users)  # folded again at the next step
            raise
        self.folded += len(kept_users)
        return len(kept_users)

    # --- online: its own thread -------------------------------------------------------

    def start(self, leads: Callable[[], bool] = lambda: True) -> None:
        """Step on a thread of its own whenever :meth:`wake` is called (and at least every
        second), while ``leads()`` (in a group only the exporter fits)."""
        if self._thread is not None:
            return

        def run() -> None:
            while not self._stop.is_set():
                self._wake.wait(1.0)
                self._wake.clear()
                if not self._stop.is_set() and leads():
                    self.step(paced=True)

        self._thread = threading.Thread(target=run, name="vidrec-factorization", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New views arrived: step soon (online)."""
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def status(self) -> dict[str, Any]:
        return {"fits": self.fits, "fitted_pairs": self.fitted_pairs, "version": self.version,
                "users_folded": self.folded, "failed": self.failed,
                "last_fit_seconds": round(self.fit_seconds, 4)}
