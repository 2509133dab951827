"""The sequence tower: it learns an order, its export scores as the network does, a
checkpoint brings it back, and the service's reading of a history matches training's."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from app.scoring.sequence import SequenceModel, load_sequence
from feature_store.activity.base import HistoryEntry
from feature_store.models import sequence_io
from feature_store.models.registry import ModelRegistry
from feature_store.settings import SequenceSettings
from trainer.sequence import SequenceTrainer, windows
from trainer.sequence_export import writer
from trainer.sequence_fit import TowerFit
from trainer.sequence_worker import RemoteFit

SMALL = SequenceSettings(dim=16, blocks=1, max_len=8, dropout=0.0, epochs=100, batch_size=32,
                         min_refit=1, refit_every=10)
VIDEOS = 12


def cycle_views(users: int, length: int) -> list[tuple[str, str]]:
    """Every user watches v0, v1, ... in a cycle from their own start: the next video is
    the one after the last, whoever the user."""
    views = []
    for u in range(users):
        for step in range(length):
            views.append((f"u{u}", f"v{(u + step) % VIDEOS}"))
    return views


@pytest.fixture(scope="module")
def fitted() -> SequenceTrainer:
    trainer = SequenceTrainer(SMALL, seed=3)
    trainer.add_views(cycle_views(24, 10))
    assert trainer.due()
    assert trainer.refit()
    assert not trainer.due()
    return trainer


def history(videos: list[str]) -> list[HistoryEntry]:
    """A history of finishes, newest first, of ``videos`` watched in that order."""
    return [HistoryEntry(video_id=v, watch_ratio=1.0, ts=1000 + i, action="finish")
            for i, v in reversed(list(enumerate(videos)))]


def test_windows_make_every_view_but_the_first_a_target_once() -> None:
    views = list(range(1, 12))
    made = windows(views, 4)
    targets = sorted(t for _, ys in made for t in ys)
    assert targets == views[1:]
    assert all(len(xs) <= 4 and len(xs) == len(ys) for xs, ys in made)


def test_a_video_chosen_again_moves_to_the_end_and_old_users_are_dropped() -> None:
    trainer = SequenceTrainer(SMALL.model_copy(update={"max_views": 100}))
    trainer.add_views([("a", "x"), ("a", "y"), ("a", "x")])
    assert [trainer.ids[c - 1] for c in trainer.views["a"]] == ["y", "x"]
    trainer.add_views([(f"u{i}", "z") for i in range(120)])
    assert trainer.kept <= 100 and "a" not in trainer.views


def test_the_tower_learns_what_comes_next(fitted: SequenceTrainer, tmp_path: Path) -> None:
    published = fitted.published
    assert published is not None
    writer(published, SMALL.max_len)(tmp_path)
    session = ort.InferenceSession(str(tmp_path / sequence_io.ENCODER_FILE))
    items = np.load(tmp_path / sequence_io.ITEMS_FILE)
    ids = (tmp_path / sequence_io.IDS_FILE).read_text().split()
    model = SequenceModel("v1", session, items, ids, SMALL.max_len)
    candidates = [f"v{i}" for i in range(VIDEOS)]
    for start in (0, 5, 9):
        watched = [f"v{(start + k) % VIDEOS}" for k in range(4)]
        logits = model.logits(history(watched), candidates)
        assert logits is not None
        assert candidates[int(np.argmax(logits))] == f"v{(start + 4) % VIDEOS}"


def test_the_onnx_encoder_computes_what_the_network_does(
    fitted: SequenceTrainer, tmp_path: Path
) -> None:
    published = fitted.published
    assert published is not None
    writer(published, SMALL.max_len)(tmp_path)
    session = ort.InferenceSession(str(tmp_path / sequence_io.ENCODER_FILE))
    codes = sequence_io.left_padded([[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12]], SMALL.max_len)
    (state,) = session.run([sequence_io.STATE], {sequence_io.CODES: codes})
    with torch.no_grad():
        expected = published.tower.last_state(torch.from_numpy(codes)).numpy()
        # Training's shorter windows (padded to the batch's longest) give the same state.
        short = published.tower.last_state(torch.tensor([[1, 2, 3]])).numpy()
    np.testing.assert_allclose(state, expected, atol=1e-4)
    np.testing.assert_allclose(short[0], expected[0], atol=1e-4)


def test_a_user_without_known_views_gets_no_term(fitted: SequenceTrainer, tmp_path: Path) -> None:
    published = fitted.published
    assert published is not None
    writer(published, SMALL.max_len)(tmp_path)
    session = ort.InferenceSession(str(tmp_path / sequence_io.ENCODER_FILE))
    model = SequenceModel("v1", session, np.load(tmp_path / sequence_io.ITEMS_FILE),
                          list(published.ids), SMALL.max_len)
    assert model.logits([], ["v1"]) is None
    assert model.logits(history(["never-coded"]), ["v1"]) is None
    skipped = [HistoryEntry(video_id="v1", watch_ratio=0.0, ts=1, action="skip")]
    assert model.logits(skipped, ["v2"]) is None
    logits = model.logits(history(["v1", "v2"]), ["v3", "new-video", "v4"])
    assert logits is not None and logits[1] == np.median(logits[[0, 2]])


def test_a_checkpoint_brings_the_tower_back(fitted: SequenceTrainer, tmp_path: Path) -> None:
    fitted.save(tmp_path)
    back = SequenceTrainer(SMALL, seed=9)
    assert back.restore(tmp_path)
    assert back.ids == fitted.ids and back.count == fitted.count and back.fits == fitted.fits
    assert {u: list(v) for u, v in back.views.items()} == {
        u: list(v) for u, v in fitted.views.items()}
    assert back.published is not None and fitted.published is not None
    codes = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        np.testing.assert_allclose(back.published.tower.last_state(codes).numpy(),
                                   fitted.published.tower.last_state(codes).numpy(), atol=1e-6)
    assert not back.due()


def test_a_growing_catalog_keeps_the_rows_learnt() -> None:
    fit = TowerFit(SMALL.model_copy(update={"epochs": 1}), seed=1)
    fit.capacity = 4
    fit.model = type(fit.model)(4, SMALL)
    fit.optimizer = torch.optim.Adam(fit.model.parameters())
    trainer = SequenceTrainer(SMALL, fitter=fit)
    trainer.add_views([("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")])
    assert trainer.refit()
    before = fit.model.item.weight.detach()[:3].clone()
    trainer.add_views([(f"c{i}", f"new{i}") for i in range(6)] + [("a", "new1")])
    trainer.refit(threading.Event())
    assert fit.capacity >= 8 and fit.model.item.weight.shape[0] == fit.capacity + 1
    # Moved by the second refit's step, but from where the first left them, not afresh.
    assert torch.allclose(fit.model.item.weight.detach()[:3], before, atol=0.1)
    assert trainer.published is not None and len(trainer.published.ids) == 8


def test_a_stop_ends_a_refit_between_steps() -> None:
    trainer = SequenceTrainer(SMALL)
    trainer.add_views(cycle_views(8, 10))
    stop = threading.Event()
    stop.set()
    assert not trainer.refit(stop)
    assert trainer.published is None and trainer.fits == 0


def test_the_registry_version_serves_the_tower(fitted: SequenceTrainer, tmp_path: Path) -> None:
    published = fitted.published
    assert published is not None
    registry = ModelRegistry(tmp_path)
    version = "v-seq"
    directory = tmp_path / "written"
    directory.mkdir()
    writer(published, SMALL.max_len)(directory)
    manifest = type("M", (), {"version": version, "extra": {
        sequence_io.MANIFEST_KEY: sequence_io.describe(SMALL.max_len, SMALL.dim, 1, 1.0)}})()
    registry.artifact_path = lambda _v, name: directory / name  # type: ignore[method-assign]
    model = load_sequence(registry, manifest, ort.SessionOptions())  # type: ignore[arg-type]
    assert model is not None and model.max_len == SMALL.max_len
    assert load_sequence(registry, type("M", (), {"version": "x", "extra": {}})(),  # type: ignore[arg-type]
                         ort.SessionOptions()) is None


def next_is_learnt(trainer: SequenceTrainer) -> bool:
    published = trainer.published
    assert published is not None
    codes = [trainer.codes[f"v{k}"] for k in range(4)]
    with torch.no_grad():
        state = published.tower.last_state(torch.tensor([codes]))[0]
        logits = published.tower.item.weight[1:len(published.ids) + 1] @ state
    return published.ids[int(logits.argmax())] == "v4"


def test_a_worker_process_refits_and_a_dead_one_is_replaced() -> None:
    """Online refits run in a child process (the GIL stays the trainer's): it learns as
    the in-process fit does, goes on from its weights after a crash, and a stop kills
    it rather than waiting for the refit."""
    remote = RemoteFit(SMALL, seed=3)
    trainer = SequenceTrainer(SMALL, seed=3, fitter=remote)
    try:
        trainer.add_views(cycle_views(24, 10))
        assert trainer.refit() and next_is_learnt(trainer)
        assert remote.steps > 0 and remote.warm is not None
        assert remote._child is not None
        crashed = remote._child
        crashed.kill()  # a crashed worker is replaced at the next refit
        crashed.wait(10)
        trainer.add_views([("late", "v1")])
        assert trainer.refit() and next_is_learnt(trainer)  # warm: from the last weights
        assert remote._child is not None and remote._child.pid != crashed.pid
        stop = threading.Event()
        stop.set()
        assert not trainer.refit(stop)
        assert remote._child is None  # killed, not waited for
    finally:
        trainer.close()


def test_the_exports_pace_the_refits_when_not_in_the_background() -> None:
    """``vidrec eval``: a due refit starts at an export and is published at the next one,
    whatever the machine's speed (reproducible figures)."""
    from trainer.stages.sequence import SequenceStage

    paced = SMALL.model_copy(update={"background": False, "min_refit": 50})
    stage = SequenceStage(SequenceTrainer(paced, seed=3))
    stage.trainer.add_views(cycle_views(24, 10))
    assert stage.for_export() is None  # started at this export...
    first = stage.for_export()  # ...published at the next
    assert first is not None and first.views == 240 and first.fits == 1
    stage.trainer.add_views([(f"n{i}", f"v{i % VIDEOS}") for i in range(60)])
    assert stage.for_export() is first  # the refit started now is the next export's
    second = stage.for_export()
    assert second is not None and second.views == 300 and second.fits == 2
    assert stage.for_export() is second  # nothing new: nothing started
    stage.close()


def test_logistic_regression_recovers_its_coefficients() -> None:
    from trainer.sequence_weight import logistic

    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(20_000), rng.normal(size=20_000), rng.normal(size=20_000)])
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(x @ [-0.5, 1.5, 0.7])))).astype(float)
    np.testing.assert_allclose(logistic(x, y), [-0.5, 1.5, 0.7], atol=0.08)


def test_the_fusion_weight_follows_what_the_tower_adds(fitted: SequenceTrainer) -> None:
    """A tower that knows the next view beside a ranker that does not gets weight; one
    whose logits the labels ignore, beside a ranker that knows them, gets about none."""
    from trainer.sequence_weight import FusionWeight

    published = fitted.published
    assert published is not None
    rng = np.random.default_rng(1)
    useful, useless = FusionWeight(SMALL.max_len), FusionWeight(SMALL.max_len)
    for _ in range(600):
        start = int(rng.integers(VIDEOS))
        views = [fitted.codes[f"v{(start + k) % VIDEOS}"] for k in range(4)]
        follows = bool(rng.random() < 0.5)
        nxt = (start + 4) % VIDEOS if follows else int(rng.integers(VIDEOS))
        label = 1.0 if follows else 0.0
        code = fitted.codes[f"v{nxt}"]
        useful.keep(views, code, label, 0.5 + 0.1 * rng.normal())  # the ranker: nothing
        coin = float(rng.random() < 0.5)
        useless.keep(views, code, coin, 0.2 + 0.6 * coin)  # the ranker knows; the tower not
    assert useful.update(published.tower, useful.take()) > 0.2
    assert useless.update(published.tower, useless.take()) < 0.05
    assert useful.update(None, []) == useful.weight  # no serving tower: unchanged
    # Videos coded after the serving tower's refit are unknown to it, not an error.
    late = FusionWeight(SMALL.max_len)
    for i in range(300):
        late.keep([1, 2, 5000], 5001 if i % 2 else 3, float(i % 3 == 0), 0.4)
    late.update(published.tower, late.take())
