"""trainer.offline: the online loop replayed in the caller's thread, and offline epochs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.evaluation.datasets import movielens_events
from app.evaluation.runner import ReplayHandle
from app.wiring import eval_trainers
from feature_store.models.quality import roc_auc
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from tests.factories import write_movielens
from trainer.offline import OnlineReplay, build_samples, train_offline

MIN_TS = 946_684_800_000
RATING_LABELS = {  # rating >= 4, one weighted sample per rating (app.evaluation.stream)
    "sample_weights": {"finish": 0.0, "like": 0.0, "dislike": 0.0},
}


def _settings(tmp: Path) -> Settings:
    return Settings(
        data_dir=tmp,
        event_log={"memory_partitions": 1},
        features={"short_watch_ratio": 0.5},
        trainer={**RATING_LABELS, "batch_size": 128, "export_every_s": 0,
                 "checkpoint_every_s": 1e9},
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("ml") / "ml-tiny"
    write_movielens(directory, users=50, items=50, per_user=24)
    events, videos = movielens_events(directory, MIN_TS)
    lines = (directory / "u.data").read_text().splitlines()
    ratings = {
        f"ml-{u}-{i}-1": float(int(r) >= 4) for u, i, r, _ in (ln.split("\t") for ln in lines)
    }
    return events, videos, ratings


def test_the_composition_root_hands_eval_these_trainers() -> None:
    trainers = eval_trainers()
    assert trainers.replay is OnlineReplay and trainers.offline is train_offline


def test_replay_scores_every_rating_before_training_on_it(dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    events, videos, ratings = dataset
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(videos)
        replay = OnlineReplay(res)
        assert isinstance(replay, ReplayHandle)
        try:
            half = len(events) // 2
            res.event_log.produce(events[:half])
            first = replay.drain()
            res.event_log.produce(events[half:])
            second = replay.drain()
            assert len(replay.drain().event_ids) == 0  # nothing new: nothing trained
            version = replay.export()
        finally:
            replay.close()
        assert res.registry.active() == version
    ids = first.event_ids + second.event_ids
    weights = np.concatenate([first.weights, second.weights])
    labels = np.concatenate([first.labels, second.labels])
    scores = np.concatenate([first.scores, second.scores])
    weighted = {i: lab for i, lab, w in zip(ids, labels, weights, strict=True) if w > 0}
    assert weighted == ratings  # one sample per rating, labelled rating >= 4
    assert np.all((scores > 0) & (scores < 1))
    mask = np.array([w > 0 for w in weights])
    assert roc_auc(scores[mask][len(ratings) // 2 :], labels[mask][len(ratings) // 2 :]) > 0.55


def test_build_samples_matches_the_online_labels(dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    events, videos, ratings = dataset
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(videos)
        samples, values = build_samples(res, events, 128)
    assert len(samples) == len(values)
    weighted = {s.event.event_id: s.label for s in samples if s.weight > 0}
    assert weighted == ratings
    # Features as of each event: a user's first rating sees no history.
    first = next(i for i, s in enumerate(samples) if s.weight > 0)
    _, lengths = values.multi("history")
    assert lengths[first] == 0


def test_offline_training_early_stops_on_validation(dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    events, videos, ratings = dataset
    ids = [e.event_id for e in events if e.event_id in ratings]  # time order
    head = int(len(ids) * 0.8)
    fit = head - head // 8
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(videos)
        result = train_offline(res, events, ids[:fit], ids[fit:head], ids[head:],
                               max_epochs=4, patience=1, seed=0)
    aucs = [e["valid_auc"] for e in result.epochs]
    assert 1 <= len(aucs) <= 4
    assert result.best_epoch == int(np.argmax(aucs)) + 1
    if len(aucs) < 4:  # stopped early: the last epoch did not improve
        assert aucs[-1] <= max(aucs)
    assert result.test.event_ids == ids[head:]
    assert np.all((result.test.scores > 0) & (result.test.scores < 1))
    assert list(result.test.labels) == [ratings[i] for i in ids[head:]]
