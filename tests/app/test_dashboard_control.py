"""The control channel and its listener, on both backends (memory and a real Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from feature_store.ops.control import (
    LIVE,
    Ack,
    Command,
    ControlChannel,
    MemoryChannel,
    RedisChannel,
)
from tests.app.conftest import wait_for
from trainer.control import ControlListener


class FakeTrainer:
    """A TrainerHandle whose loop reports the state it was asked for."""

    def __init__(self) -> None:
        self.state = "running"
        self.exports: list[bool] = []

    def start(self) -> None: ...

    def run(self) -> None: ...

    def stop(self, timeout_s: float = 30.0) -> None:
        self.state = "stopped"

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "group_id": "fake-group"}

    def export_now(self, activate: bool = True) -> str:
        if activate is None:
            raise RuntimeError("unreachable")
        self.exports.append(activate)
        if len(self.exports) > 2:
            raise RuntimeError("disk full")
        return f"main-v{len(self.exports)}"

    def pause(self) -> None:
        threading.Timer(0.05, lambda: setattr(self, "state", "paused")).start()

    def resume(self) -> None:
        threading.Timer(0.05, lambda: setattr(self, "state", "running")).start()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def channel(request: pytest.FixtureRequest) -> Iterator[ControlChannel]:
    if request.param == "memory":
        yield MemoryChannel()
        return
    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        yield RedisChannel(client, block_s=0.2)
    finally:
        client.close()


def test_commands_after_the_cursor_and_acks_in_order(channel: ControlChannel) -> None:
    channel.send(Command("pause", issuer="old"))
    cursor = channel.tail()
    assert channel.commands(cursor, 0.05) == []
    sent = Command("export", {"activate": False}, issuer="alice (admin)")
    channel.send(sent)
    got = channel.commands(cursor, 1.0)
    assert [c for _, c in got] == [sent]  # the command from before the cursor is not replayed
    assert channel.commands(got[-1][0], 0.05) == []
    channel.ack(Ack(sent.id, "accepted", by="g"))
    assert channel.wait(sent.id, 0.05) is None  # accepted is not final
    channel.ack(Ack(sent.id, "done", "exported v9", {"version": "v9"}, by="g"))
    final = channel.wait(sent.id, 1.0)
    assert final is not None and final.result == {"version": "v9"}
    assert [a.status for a in channel.acks(sent.id)] == ["accepted", "done"]


def test_wait_returns_as_soon_as_another_thread_acks(channel: ControlChannel) -> None:
    command = Command("status")
    acking = threading.Timer(0.1, lambda: channel.ack(Ack(command.id, "failed", "no")))
    acking.start()
    started = time.monotonic()
    ack = channel.wait(command.id, 5.0)
    assert ack is not None and ack.status == "failed"
    assert time.monotonic() - started < 2.0
    # The ack can be read before its sender has read Redis's reply: the fixture must not
    # close the client under it (a .ci/run saw the timer thread fail on a closed socket).
    acking.join(10)


def test_listener_acknowledges_and_carries_out_each_command(channel: ControlChannel) -> None:
    trainer = FakeTrainer()
    with ControlListener(channel, trainer, poll_s=0.1):
        pause = Command("pause", issuer="bob")
        channel.send(pause)
        ack = channel.wait(pause.id, 5.0)
        assert ack is not None and ack.status == "done" and ack.result == {"state": "paused"}
        assert ack.by == "fake-group"
        assert [a.status for a in channel.acks(pause.id)] == ["accepted", "done"]
        assert trainer.state == "paused"

        resume = channel.send(Command("resume"))
        assert (a := channel.wait(resume, 5.0)) is not None and a.result == {"state": "running"}

        export = channel.send(Command("export", {"activate": False}))
        assert (a := channel.wait(export, 5.0)) is not None and a.result == {"version": "main-v1"}
        assert trainer.exports == [False]

        unknown = channel.send(Command("reboot"))
        assert (a := channel.wait(unknown, 5.0)) is not None and a.status == "failed"
        assert "unknown action" in a.message

        other = channel.send(Command("pause", target="retrain-x"))  # not this trainer's
        assert channel.wait(other, 0.5) is None

        channel.send(Command("export"))
        failing = channel.send(Command("export"))  # the fake's third export raises
        assert (a := channel.wait(failing, 5.0)) is not None and a.status == "failed"
        assert "disk full" in a.message
        still = channel.send(Command("status"))  # the listener goes on after a failure
        assert (a := channel.wait(still, 5.0)) is not None and a.status == "done"
    assert trainer.state == "running"


class FollowerTrainer(FakeTrainer):
    """A member of a group whose exporter lease another member holds."""

    def status(self) -> dict[str, Any]:
        return {**super().status(), "exporter": False}


def test_only_the_groups_exporter_answers_export_now(channel: ControlChannel) -> None:
    leader, follower = FakeTrainer(), FollowerTrainer()
    with (
        ControlListener(channel, follower, poll_s=0.1),
        ControlListener(channel, leader, poll_s=0.1),
    ):
        export = channel.send(Command("export"))
        ack = channel.wait(export, 5.0)
        assert ack is not None and ack.status == "done"
        pause = channel.send(Command("pause"))  # every member still pauses
        wait_for(lambda: len([a for a in channel.acks(pause) if a.status == "done"]) == 2)
    assert leader.exports == [True] and follower.exports == []
    assert len([a for a in channel.acks(export) if a.status == "accepted"]) == 1


def test_retrain_without_a_retrainer_fails_with_a_reason(channel: ControlChannel) -> None:
    with ControlListener(channel, FakeTrainer(), poll_s=0.1):
        sent = channel.send(Command("retrain", {"from_ts_ms": 0}, target=LIVE))
        ack = channel.wait(sent, 5.0)
    assert ack is not None and ack.status == "failed" and "retrain" in ack.message


@pytest.mark.redis
def test_redis_channel_crosses_clients(redis_url: str) -> None:
    """Two clients (as the API and ``vidrec train`` would hold) talk through one Redis."""
    api_client = redis.Redis.from_url(redis_url)
    trainer_client = redis.Redis.from_url(redis_url)
    try:
        api, trainer_side = RedisChannel(api_client), RedisChannel(trainer_client, block_s=0.2)
        trainer = FakeTrainer()
        with ControlListener(trainer_side, trainer, poll_s=0.2):
            sent = api.send(Command("pause", issuer="carol (admin)"))
            ack = api.wait(sent, 5.0)
        assert ack is not None and ack.status == "done" and trainer.state == "paused"
    finally:
        api_client.close()
        trainer_client.close()


def test_replay_log_consumers_start_at_the_chosen_time() -> None:
    from feature_store.eventlog import open_event_log
    from feature_store.settings import Settings
    from tests.factories import make_event
    from trainer.retrain import ReplayLog

    log = open_event_log(Settings())
    try:
        log.produce([make_event(user_id=f"u{i}") for i in range(20)])
        time.sleep(0.02)
        cut = int(time.time() * 1000)
        time.sleep(0.02)
        later = [make_event(user_id=f"u{i}") for i in range(10)]
        log.produce(later)
        replay = ReplayLog(log, cut)
        with replay.consumer("retrain-group") as consumer:
            got = consumer.poll(100, timeout_s=0.5)
        assert sorted(r.event.event_id for r in got) == sorted(e.event_id for e in later)
        assert replay.end_offsets() == log.end_offsets()  # everything else is the live log
    finally:
        log.close()
