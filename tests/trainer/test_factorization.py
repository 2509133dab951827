"""The live matrix factorisation (``trainer/factorization.py``): fits, fold-ins, failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.scoring.factorization import factorization_scores
from feature_store.errors import StoreUnavailable
from feature_store.factors import MemoryFactors
from feature_store.settings import FactorizationSettings, SequenceSettings
from trainer.factorization import LiveFactorization
from trainer.sequence import SequenceTrainer
from trainer.stages.sequence import SequenceStage

A = [f"a{i}" for i in range(20)]
B = [f"b{i}" for i in range(20)]


def taste_views(users: int = 100, per_user: int = 8, seed: int = 0) -> list[tuple[str, str]]:
    """Users ``u0``... of two tastes: the first half chooses videos of A, the rest of B."""
    rng = np.random.default_rng(seed)
    views = [(f"u{u}", (A if u < users // 2 else B)[v])
             for u in range(users) for v in rng.choice(20, per_user, replace=False)]
    return [views[i] for i in rng.permutation(len(views))]


def live(settings: FactorizationSettings | None = None,
         store: MemoryFactors | None = None) -> LiveFactorization:
    return LiveFactorization(settings or FactorizationSettings(),
                             SequenceTrainer(SequenceSettings()), store or MemoryFactors())


def lean(store: MemoryFactors, user: str) -> float:
    """How far ``user``'s scores prefer A's videos to B's (standard deviations)."""
    scores = factorization_scores(store.read(user), A + B)
    assert scores is not None, user
    return float(scores[:20].mean() - scores[20:].mean())


def test_users_lean_their_own_way_and_a_new_user_is_folded_in_at_once() -> None:
    factorization = live()
    store = factorization.store
    assert isinstance(store, MemoryFactors)
    views = taste_views()
    for start in range(0, len(views), 50):  # batch by batch, as the trainer adds them
        factorization.views.add_views(views[start:start + 50])
        factorization.step()
    assert factorization.fits >= 5 and factorization.failed == 0
    assert lean(store, "u1") > 0.5 and lean(store, "u99") < -0.5
    fits = factorization.fits

    factorization.views.add_views([("new", "b1"), ("new", "b2"), ("new", "b3")])
    factorization.step()  # not a fit (3 new pairs): the new user's fold-in
    assert factorization.fits == fits and factorization.folded >= 1
    assert lean(store, "new") < -0.5
    assert factorization_scores(store.read("nobody"), A + B) is None


def test_fits_come_sooner_early_and_every_refit_every_pairs_later() -> None:
    settings = FactorizationSettings(refit_every=300, min_refit=20)
    factorization = live(settings)
    views = taste_views(users=600, per_user=10)
    fitted = []
    for start in range(0, len(views), 10):
        factorization.views.add_views(views[start:start + 10])
        factorization.step()
        if factorization.fits > len(fitted):
            fitted.append(factorization.fitted_pairs)
    gaps = np.diff(fitted)
    assert fitted[0] == 20 and gaps[:3].max() <= 30  # a tenth of few, at least min_refit
    assert gaps[-3:].min() >= 300 and gaps[-3:].max() <= 310  # then refit_every (a batch)


class FlakyStore(MemoryFactors):
    """Fold-ins fail while ``down``."""

    down = False

    def fold(self, version: int, users: object, user_vectors: object) -> None:
        if self.down:
            raise StoreUnavailable("factors fold failed: down")
        super().fold(version, users, user_vectors)  # type: ignore[arg-type]


def test_a_fold_in_the_store_refused_is_written_at_a_later_step() -> None:
    store = FlakyStore()
    factorization = live(store=store)
    views = taste_views()
    for start in range(0, len(views), 50):
        factorization.views.add_views(views[start:start + 50])
        factorization.step()
    store.down = True
    factorization.views.add_views([("late", "a1"), ("late", "a2")])
    factorization.step()
    assert factorization.failed == 1 and store.read("late")[1] is None
    store.down = False
    factorization.step()
    assert store.read("late")[1] is not None and lean(store, "late") > 0.2


def test_online_the_stage_folds_a_user_in_on_its_own_thread() -> None:
    from tests.trainer.helpers import wait_until

    sequence = SequenceTrainer(SequenceSettings(background=True))
    factorization = LiveFactorization(FactorizationSettings(refit_interval_s=0), sequence,
                                      MemoryFactors())
    stage = SequenceStage(sequence, factorization=factorization)
    assert stage.background  # sequence.background: the factorisation steps on its thread
    try:
        sequence.add_views(taste_views())
        factorization.step()  # the first fit
        assert factorization.fits == 1
        factorization.start()
        sequence.add_views([("fresh", "b4"), ("fresh", "b5")])
        stage._factorize()  # what process() does after adding a batch's views
        wait_until(lambda: factorization.store.read("fresh")[1] is not None, 30, "a fold-in")
    finally:
        factorization.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pipeline_has_a_factorization_only_when_enabled(enabled: bool, tmp_path: Path) -> None:
    from feature_store.runtime.resources import open_resources
    from feature_store.settings import Settings
    from trainer.loop import OnlineTrainer

    settings = Settings(data_dir=tmp_path, factorization=FactorizationSettings(enabled=enabled))
    with open_resources(settings) as resources:
        trainer = OnlineTrainer(resources)
        try:
            stage = trainer.stages.sequence
            assert stage is not None and (stage.factorization is not None) == enabled
            assert ("factorization" in stage.status()) == enabled
        finally:
            trainer.close()
