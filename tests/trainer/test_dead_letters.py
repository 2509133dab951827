"""A bad record last in its partition, met by the trainer: dead-lettered once, across restarts.

The trainer commits only with a checkpoint, and checkpointed only when it
had trained something: a bad record after the last trained one was never
committed past, so every restart met it and dead-lettered it again (issue
#22). On the in-process log and on the Kafka-protocol broker.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from tests.factories import make_event
from tests.trainer.helpers import trainer_settings, wait_until
from trainer.component import TrainerComponent


def _settings(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Settings:
    settings = trainer_settings(tmp_path, group_id="dl-trainer")
    if backend == "memory":
        return settings
    broker = request.getfixturevalue("kafka_broker")
    extra: dict[str, Any] = {
        "event_log": {"backend": "kafka", "topic_namespace": f"dl{uuid.uuid4().hex[:10]}"},
        "kafka": {"bootstrap_servers": broker.bootstrap, "partitions": 2,
                  "session_timeout_ms": 2000, "heartbeat_interval_ms": 200},
    }
    return settings.model_copy(update={
        "event_log": settings.event_log.model_copy(update=extra["event_log"]),
        "kafka": settings.kafka.model_copy(update=extra["kafka"]),
    })


def _trained(trainer: TrainerComponent, count: int) -> None:
    wait_until(lambda: trainer.status()["events_total"] >= count, 60, f"{count} events trained")


@pytest.mark.parametrize("backend", ["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_a_bad_record_last_in_its_partition_is_dead_lettered_once_across_restarts(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    settings = _settings(tmp_path, backend, request)
    with open_resources(settings) as resources:
        log = resources.event_log
        log.produce([make_event(event_id="before", user_id="victim")])
        trainer = TrainerComponent(resources)
        trainer.start()
        _trained(trainer, 1)
        trainer.loop.checkpoint()  # what it trained is committed: the bad record comes after
        log.produce_raw(b"victim", b"\xffbroken")
        wait_until(lambda: log.dead_letter_count() == 1, 60, "the bad record dead-lettered")
        trainer.stop()

    for restart in range(2):
        with open_resources(settings) as resources:
            log = resources.event_log
            log.produce([make_event(event_id=f"after-{restart}", user_id="victim")])
            trainer = TrainerComponent(resources)
            trainer.start()
            _trained(trainer, 2 + restart)  # read past where the bad record lies
            trainer.stop()
            letters = log.dead_letters()
    assert [(letter.group, letter.value) for letter in letters] == [
        ("dl-trainer", b"\xffbroken")
    ]
