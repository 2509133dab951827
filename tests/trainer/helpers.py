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


PATIENT_PRODUCER_ENV = {"VIDREC_KAFKA__PRODUCE_TIMEOUT_MS": "60000"}
"""For a test that loads a stream with its own producer: ``kafka.produce_timeout_ms``
(the ingest route's budget, 600 ms) also bounds a send's wait for the topic's metadata,
which a broker on a machine at load 8 can take longer to give. The API answers 503 and
its client resends; a test has no one to resend, so it waits."""


def seed(resources: Resources, world: SyntheticWorld, events: list[Event]) -> None:
    resources.catalog.upsert(world.videos())
    produce(resources, events)


def produce(resources: Resources, events: list[Event], chunk: int = 5_000) -> None:
    """Append ``events`` in chunks, each acknowledged within two minutes: a load tool, not a
    client under the API's deadline (with Kafka, settings from :data:`PATIENT_PRODUCER_ENV`)."""
    for start in range(0, len(events), chunk):
        resources.event_log.produce(events[start : start + chunk], timeout_s=120)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def wait_for_count(
    count: Callable[[], int], target: int, stall_s: float, what: str, every_s: float = 0.2
) -> None:
    """Until ``count() >= target``, failing only once it has not grown for ``stall_s``.

    For work whose pace is the machine's (training a stream on 2 shared cores): a
    fixed deadline fails a slow but healthy run at load 8, while a stall (nothing
    trained for ``stall_s``) is what a stuck process looks like at any load.
    """
    best, moved_at = count(), time.monotonic()
    while best < target:
        time.sleep(every_s)
        now = count()
        if now > best:
            best, moved_at = now, time.monotonic()
        elif time.monotonic() - moved_at > stall_s:
            raise TimeoutError(
                f"{what}: stuck at {best} of {target} for {stall_s} s"
            )
