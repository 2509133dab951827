"""The matrix-factorisation baseline's fits made ahead in worker processes give the same
scores as fitted one by one in the caller (``app/evaluation/factorization.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from app.evaluation import factorization
from app.evaluation.factorization import AlsParams, MatrixFactorization
from app.evaluation.metrics import rank_in

pytestmark = pytest.mark.skipif(not factorization.available(), reason="implicit not installed")


def _log(seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """A stream of samples (user, video, positive) with some taste in it."""
    rng = np.random.default_rng(seed)
    users, videos = [], []
    for _ in range(1500):
        u = int(rng.integers(0, 120))
        v = int((u % 6) * 10 + rng.integers(0, 12)) if rng.random() < 0.8 else int(
            rng.integers(0, 70))
        users.append(f"u{u}")
        videos.append(f"v{v}")
    return users, videos, rng.random(1500) < 0.7


def _scores(model: MatrixFactorization, questions: list[tuple[str, int]],
            candidates: list[str]) -> list[np.ndarray]:
    return [model.scores(user, candidates, before) for user, before in questions]


def test_fits_made_ahead_in_workers_score_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    users, videos, positive = _log()
    params = AlsParams(factors=8, iterations=4, refit_every=40)
    rng = np.random.default_rng(1)
    befores = np.sort(rng.integers(0, len(users) + 1, size=60)).tolist()
    questions = [(f"u{int(rng.integers(0, 130))}", b) for b in befores]  # some users unknown
    candidates = [f"v{i}" for i in range(75)]  # some videos never seen

    here = MatrixFactorization(users, videos, positive, params, seed=3)
    expected = _scores(here, questions, candidates)
    points = here.refit_points(befores)
    assert here.fits == len(points) > 5

    monkeypatch.setattr(factorization, "PARALLEL_FITS", 1)
    ahead = MatrixFactorization(users, videos, positive, params, seed=3)
    with ahead.prefitted(befores, workers=2):
        assert ahead._ahead is not None  # the fits come from the workers
        got = _scores(ahead, questions, candidates)
    assert ahead.fits == here.fits
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_array_equal(have, want)


def test_questions_out_of_the_planned_order_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    users, videos, positive = _log()
    params = AlsParams(factors=4, iterations=2, refit_every=40)
    monkeypatch.setattr(factorization, "PARALLEL_FITS", 1)
    model = MatrixFactorization(users, videos, positive, params)
    with model.prefitted([500, 1000, 1500], workers=1), pytest.raises(RuntimeError):
        model.scores("u1", ["v1"], 1500)


def test_ranks_worked_out_during_the_replay_are_the_baselines() -> None:
    """:class:`RanksAhead` fed the samples part by part and the questions as they come
    gives the ranks :class:`MatrixFactorization` gives over the whole stream after it."""
    users, videos, positive = _log(2)
    params = AlsParams(factors=8, iterations=4, refit_every=40)
    rng = np.random.default_rng(5)
    weights = np.where(rng.random(len(users)) < 0.9, 1.0, 0.0)  # some samples unweighted
    labels = np.where(positive, 1.0, 0.0)
    kept = np.flatnonzero(weights > 0)
    pool = [f"v{i}" for i in range(75)]
    ahead = factorization.RanksAhead(params, seed=3)
    questions: list[tuple[str, str, tuple[str, ...], int]] = []
    try:
        start, before = 0, 0
        while start < len(users):
            end = min(len(users), start + int(rng.integers(1, 50)))
            part = slice(start, end)
            w = weights[part] > 0
            ahead.add(users[part], videos[part], w & (labels[part] > 0.5))
            before += int(w.sum())
            start = end
            for _ in range(int(rng.integers(0, 3))):
                user = f"u{int(rng.integers(0, 130))}"
                candidates = tuple(rng.permutation(pool)[:20].tolist())
                video = candidates[int(rng.integers(0, 20))]
                ahead.ask(before, user, video, candidates)
                questions.append((user, video, candidates, before))
        got = ahead.ranks()
    finally:
        ahead.close()
    model = MatrixFactorization([users[i] for i in kept], [videos[i] for i in kept],
                                labels[kept] > 0.5, params, seed=3)
    want = [rank_in(video, candidates, model.scores(user, candidates, before))
            for user, video, candidates, before in questions]
    assert len(questions) > 40 and model.fits > 5
    assert got == want
