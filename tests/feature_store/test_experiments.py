"""Experiment definitions: the assignment hash and the book in the registry directory."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from feature_store.errors import Conflict, InvalidInput, NotFound
from feature_store.experiments import (
    Arm,
    ExperimentSpec,
    ExperimentStore,
    arm_index,
    salt_bytes,
    thresholds,
)

USERS = [f"user-{i}" for i in range(10_000)]


def spec(experiment_id: str = "e1", *weights: float, salt: str | None = None) -> ExperimentSpec:
    weights = weights or (1.0, 1.0)
    arms = [Arm(name=f"a{i}", family=f"f{i}", weight=w) for i, w in enumerate(weights)]
    return ExperimentSpec(id=experiment_id, arms=tuple(arms), salt=salt)


def assignment(s: ExperimentSpec) -> list[int]:
    salt, bounds = salt_bytes(s), thresholds(s.arms)
    return [arm_index(salt, user, bounds) for user in USERS]


def test_two_arms_are_balanced_within_two_percent_over_10000_users() -> None:
    counts = Counter(assignment(spec()))
    assert set(counts) == {0, 1}
    for arm in (0, 1):
        assert abs(counts[arm] / len(USERS) - 0.5) < 0.02, counts


def test_weights_split_users_in_proportion() -> None:
    counts = Counter(assignment(spec("w", 1, 2, 1)))
    for arm, share in ((0, 0.25), (1, 0.5), (2, 0.25)):
        assert abs(counts[arm] / len(USERS) - share) < 0.02, counts


def test_assignment_is_stable_across_processes_and_salted_per_experiment() -> None:
    first = assignment(spec())
    assert assignment(spec()) == first
    code = (
        "from tests.feature_store.test_experiments import assignment, spec;"
        "import json; print(json.dumps(assignment(spec())))"
    )
    other = subprocess.run(  # another interpreter: a new PYTHONHASHSEED, the same arms
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=Path(__file__).parents[2],
    )
    assert [int(x) for x in other.stdout.strip()[1:-1].split(",")] == first
    # Another experiment (its own salt) mixes users anew: about half change arm.
    changed = sum(a != b for a, b in zip(first, assignment(spec("e2")), strict=True))
    assert 0.45 < changed / len(USERS) < 0.55
    assert assignment(spec("e2", salt="e1")) == first  # the salt, not the id, decides


def test_an_experiment_refuses_repeated_arm_names_and_one_arm(tmp_path: Path) -> None:
    twice = ExperimentSpec(id="x", arms=(Arm(name="a", family="f"), Arm(name="a", family="g")))
    with pytest.raises(InvalidInput) as raised:
        ExperimentStore(tmp_path).start(twice, "alice", 1)
    assert raised.value.field == "experiment.arms.1.name"
    with pytest.raises(ValueError):
        ExperimentSpec(id="x", arms=(Arm(name="a", family="f"),))


def test_book_starts_one_at_a_time_and_ends_with_a_winner(tmp_path: Path) -> None:
    store = ExperimentStore(tmp_path)
    assert store.running() is None
    started = store.start(spec("e1"), "alice", 1000)
    assert started.status == "running" and started.started_by == "alice"
    with pytest.raises(Conflict, match="e1"):
        store.start(spec("e2"), "bob", 2000)
    other = ExperimentStore(tmp_path)  # another process reading the same directory
    assert other.running() == started
    with pytest.raises(NotFound):
        store.end("e1", "bob", 3000, winner="nope")
    ended = store.end("e1", "bob", 3000, winner="a1", winner_version="f1-v")
    assert ended.status == "concluded" and ended.winner == "a1"
    assert other.running() is None and other.get("e1").winner_version == "f1-v"
    with pytest.raises(Conflict, match="used before"):
        store.start(spec("e1"), "carol", 4000)
    with pytest.raises(Conflict, match="concluded already"):
        store.end("e1", "carol", 4000)


def test_configured_experiments_start_once(tmp_path: Path) -> None:
    store = ExperimentStore(tmp_path)
    assert store.ensure([spec("c1"), spec("c2")], "settings", 1) == ["c2"]  # c1 runs
    assert store.running() is not None and store.running().id == "c1"  # type: ignore[union-attr]
    store.end("c1", "op", 2)
    assert store.ensure([spec("c1")], "settings", 3) == []  # known: not started again
    assert store.running() is None
