"""Kill test: SIGKILL a ``vidrec train`` process mid-stream, restart it, count.

Every event id must be trained exactly once in the state that survives: at
least once (nothing lost: offsets are committed only with a checkpoint that
holds their training) and at most once (the killed run's uncheckpointed work
is rolled back with the state, and redelivered events already in the
checkpoint are skipped by its dedupe window). The trainer's audit (a debug
setting) writes the ids each checkpoint covers; restarts discard segments
of checkpoints that never became current.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld
from tests.trainer.helpers import PATIENT_PRODUCER_ENV, WORLD, seed, wait_for_count, wait_until

pytestmark = pytest.mark.slow

GROUP = "kill-test"
EVENTS = 16_000
"""Enough that the kill lands mid-stream with a checkpoint behind it and batches in flight
(it comes at a quarter; 64 batches of 256 in all); the count is not the point."""


def _env(data_dir: Path, event_log: dict[str, str]) -> dict[str, str]:
    env = {
        **os.environ,
        "VIDREC_DATA_DIR": str(data_dir),
        "VIDREC_TRAINER__GROUP_ID": GROUP,
        "VIDREC_TRAINER__AUDIT": "true",
        "VIDREC_TRAINER__BATCH_SIZE": "256",
        "VIDREC_TRAINER__MAX_WAIT_MS": "50",
        "VIDREC_TRAINER__CHECKPOINT_EVERY_S": "0.4",
        "VIDREC_TRAINER__METRICS_EVERY_S": "0.05",
        "VIDREC_TRAINER__EXPORT_EVERY_S": "0",
        "VIDREC_TRAINER__THREADS": "1",
    }
    env.update(event_log)
    return env


def _status(data_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((data_dir / "timeseries" / GROUP / "status.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _audited(data_dir: Path) -> list[str]:
    ids: list[str] = []
    for path in sorted((data_dir / "trainer" / GROUP / "audit").glob("*.ids")):
        try:
            ids += path.read_text().split()
        except FileNotFoundError:  # a stale segment the restarted trainer just dropped
            continue
    return ids


def _checkpointed_events(data_dir: Path) -> int:
    root = data_dir / "trainer" / GROUP
    try:
        seq = json.loads((root / "LATEST").read_text())["seq"]
        state = json.loads((root / "checkpoints" / f"{seq:010d}" / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return int(state["events_total"])


def _start(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as stderr:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "--log-level", "WARNING", "train"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


@pytest.mark.parametrize("backend", ["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_sigkill_mid_stream_loses_nothing_and_trains_nothing_twice(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    event_log: dict[str, str] = {}
    if backend == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        event_log = {
            "VIDREC_EVENT_LOG__BACKEND": "kafka",
            "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": f"kill{os.getpid()}{int(time.time())}",
            "VIDREC_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
            "VIDREC_KAFKA__PARTITIONS": "4",
            "VIDREC_KAFKA__SESSION_TIMEOUT_MS": "2000",
            "VIDREC_KAFKA__HEARTBEAT_INTERVAL_MS": "200",
            "VIDREC_KAFKA__REQUEST_TIMEOUT_MS": "5000",
            **PATIENT_PRODUCER_ENV,
        }
    env = _env(tmp_path, event_log)
    for key, value in env.items():
        if key.startswith("VIDREC_"):
            monkeypatch.setenv(key, value)
    world = SyntheticWorld(WORLD)
    events = world.events(EVENTS)
    with open_resources(Settings()) as resources:
        seed(resources, world, events)

    log_path = tmp_path / "trainer.log"
    first = _start(env, log_path)
    try:
        wait_until(
            lambda: _checkpointed_events(tmp_path) > 0
            and _status(tmp_path).get("events_total", 0) >= EVENTS // 4,
            240,  # a bound for a process start at load 8, not an expectation
            "the first run to checkpoint a quarter of the stream",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    seen_by_killed = _status(tmp_path).get("events_total", 0)
    checkpointed = _checkpointed_events(tmp_path)
    print(f"killed after {seen_by_killed} events consumed, {checkpointed} checkpointed")
    # (The status file is a sampled metric written at its own pace: it may lag the
    # checkpoint by a batch or two, so only the checkpoint says where the kill fell.)
    assert 0 < checkpointed < EVENTS, "the kill came too late to test anything"

    second = _start(env, log_path)
    try:
        wait_for_count(lambda: len(_audited(tmp_path)), EVENTS, 120, "the restarted run")
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        second.kill()

    counts = Counter(_audited(tmp_path))
    assert set(counts) == {e.event_id for e in events}, "an event was lost"
    assert max(counts.values()) == 1, [i for i, c in counts.items() if c > 1][:10]
    assert sum(counts.values()) == EVENTS
