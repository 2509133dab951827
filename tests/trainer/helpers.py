"""Shared setup of the trainer's integration tests: settings, worlds, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feature_store.events import Event
from feature_store.runtime.resources import Resources
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld, WorldConfig

WORLD = WorldConfig(users=1_000, videos=2_000, creators=150, seed=3)


def trainer_settings(data_dir: Path, sparse: str = "memory", redis_url: str | None = None,
                     **trainer: Any) -> Settings:
    """Settings for a test trainer: quick waits, no timed exports unless asked."""
    defaults: dict[str, Any] = {
        "max_wait_ms": 30,
        "export_every_s": 0,
        "checkpoint_every_s": 3600,
        "metrics_every_s": 0.1,
    }
    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "trainer": {**defaults, **trainer},
        "sparse": {"backend": sparse},
    }
    if redis_url is not None:
        overrides["redis"] = {"url": redis_url}
    return Settings(**overrides)


def seed(resources: Resources, world: SyntheticWorld, events: list[Event]) -> None:
    resources.catalog.upsert(world.videos())
    for start in range(0, len(events), 10_000):
        resources.event_log.produce(events[start : start + 10_000])


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
