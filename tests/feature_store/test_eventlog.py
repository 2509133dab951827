"""The event log's contract, run against the in-process log and a real Kafka broker.

Each test gets its own topic namespace, so the Kafka tests share one Tansu
broker without seeing each other's records or groups. Kafka group timings are
shortened through ``KafkaSettings`` (Tansu makes a first join wait for about
half the session timeout, capped at 3 s).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from feature_store.constants import events_topic
from feature_store.errors import Conflict, EventLogUnavailable
from feature_store.eventlog import ConsumedEvent, EventConsumer, EventLog, Position, open_event_log
from feature_store.events import Event, encode_event
from feature_store.settings import EventLogSettings, KafkaSettings, Settings
from tests.factories import make_event
from tests.services import TansuBroker, free_port

pytestmark = pytest.mark.filterwarnings(
    # kafka-python 3 loads its protocol schemas with importlib.resources'
    # legacy read_text; the warning is attributed to importlib, so the
    # project-wide "kafka.*" filter does not catch it.
    "ignore::DeprecationWarning:importlib.resources._legacy"
)

PARTITIONS = 4
GROUP_TIMINGS: dict[str, Any] = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 200,
    "max_poll_interval_ms": 5000,
    "request_timeout_ms": 5000,
}
"""Small enough that a Tansu group join takes about a second, not three."""


class MakeLog:
    """Opens logs of one backend in one fresh namespace; closes them at teardown."""

    def __init__(self, backend: str, bootstrap: str) -> None:
        self.backend = backend
        self.bootstrap = bootstrap
        self.namespace = f"t{uuid.uuid4().hex[:12]}"
        self.opened: list[EventLog] = []

    def __call__(self, **event_log: Any) -> EventLog:
        settings = Settings(
            event_log=EventLogSettings(
                backend=self.backend,  # type: ignore[arg-type]
                topic_namespace=self.namespace,
                memory_partitions=PARTITIONS,
                **event_log,
            ),
            kafka=KafkaSettings(
                bootstrap_servers=self.bootstrap, partitions=PARTITIONS, **GROUP_TIMINGS
            ),
        )
        log = open_event_log(settings)
        self.opened.append(log)
        return log


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def make_log(backend: str, request: pytest.FixtureRequest) -> Iterator[MakeLog]:
    bootstrap = "127.0.0.1:9"
    if backend == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker").bootstrap
    factory = MakeLog(backend, bootstrap)
    yield factory
    for log in factory.opened:
        log.close()


def drain(consumer: EventConsumer, count: int, timeout_s: float = 20) -> list[ConsumedEvent]:
    """Poll until ``count`` events arrived (or the timeout passed)."""
    got: list[ConsumedEvent] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(count - len(got), 0.2)
    return got


def quiet(consumer: EventConsumer) -> list[ConsumedEvent]:
    """Whatever else arrives within half a second (expected: nothing)."""
    return consumer.poll(100, 0.5)


def ids(consumed: list[ConsumedEvent]) -> list[str]:
    return [c.event.event_id for c in consumed]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def events_for(users: int, per_user: int) -> list[Event]:
    """``per_user`` events for each of ``users`` users, interleaved, in time order."""
    return [make_event(user_id=f"u{u}") for _ in range(per_user) for u in range(users)]


def test_produce_then_consume_keeps_each_users_order(make_log: MakeLog) -> None:
    log = make_log()
    first, second = events_for(6, 4), events_for(6, 3)
    log.produce(first)
    log.produce(second)
    produced = first + second

    with log.consumer("g") as consumer:
        assert isinstance(log, EventLog) and isinstance(consumer, EventConsumer)
        got = drain(consumer, len(produced))
        assert quiet(consumer) == []

    assert sorted(ids(got)) == sorted(e.event_id for e in produced)
    for user in {e.user_id for e in produced}:
        mine = [c for c in got if c.event.user_id == user]
        assert ids(mine) == [e.event_id for e in produced if e.user_id == user]
        assert len({c.partition for c in mine}) == 1, "one user, one partition"
        offsets = [c.offset for c in mine]
        assert offsets == sorted(offsets)
    assert got[0].event == next(e for e in produced if e.event_id == got[0].event.event_id)
    assert all(c.log_ts > 0 for c in got)
    assert sum(log.end_offsets().values()) == len(produced)
    assert log.beginning_offsets() == {p: 0 for p in range(PARTITIONS)}


def test_new_member_resumes_from_the_committed_position(make_log: MakeLog) -> None:
    log = make_log()
    produced = events_for(5, 6)
    log.produce(produced)

    first = log.consumer("g")
    done = drain(first, 12)
    first.commit()
    committed = first.committed()
    read_but_uncommitted = drain(first, 7)
    first.close()
    assert len(done) == 12 and len(read_but_uncommitted) == 7

    second = log.consumer("g")
    rest = drain(second, len(produced) - 12)
    assert quiet(second) == []
    assert sorted(ids(rest)) == sorted(set(e.event_id for e in produced) - set(ids(done)))
    assert sorted(committed, key=lambda p: p.partition) == sorted(
        second.committed(), key=lambda p: p.partition
    )

    # An explicit commit moves the group back; the next member replays from there.
    partition = rest[0].partition
    second.commit()
    second.commit([Position(partition, 0)])
    second.close()
    third = log.consumer("g")
    in_partition = log.end_offsets()[partition]
    replayed = drain(third, in_partition)
    assert quiet(third) == []
    assert [(c.partition, c.offset) for c in replayed] == [
        (partition, offset) for offset in range(in_partition)
    ]


def test_two_members_split_partitions_and_consume_each_event_once(make_log: MakeLog) -> None:
    log = make_log()
    one, two = log.consumer("g"), log.consumer("g")
    members = (one, two)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the topic is empty: polling only drives the join
        for member in members:
            assert member.poll(10, 0.1) == []
        mine, theirs = set(one.assignment()), set(two.assignment())
        if mine and theirs and not mine & theirs and mine | theirs == set(range(PARTITIONS)):
            break
    assert one.assignment() and two.assignment()

    produced = events_for(40, 1)
    log.produce(produced)
    got: dict[int, list[ConsumedEvent]] = {0: [], 1: []}
    deadline = time.monotonic() + 20
    while sum(map(len, got.values())) < len(produced) and time.monotonic() < deadline:
        for index, member in enumerate(members):
            got[index] += member.poll(100, 0.1)

    everything = ids(got[0]) + ids(got[1])
    assert sorted(everything) == sorted(e.event_id for e in produced)
    assert len(everything) == len(set(everything)), "no event consumed twice"
    for index, member in enumerate(members):
        assert got[index], "both members got work"
        assert {c.partition for c in got[index]} <= set(member.assignment())

    with pytest.raises(Conflict):
        one.seek([Position(two.assignment()[0], 0)])

    two.close()
    deadline = time.monotonic() + 20
    while set(one.assignment()) != set(range(PARTITIONS)) and time.monotonic() < deadline:
        assert one.poll(10, 0.1) == []
    assert set(one.assignment()) == set(range(PARTITIONS)), "the leaver's partitions move over"
    one.close()


def test_seek_to_timestamp_and_to_offset_replay_from_there(make_log: MakeLog) -> None:
    log = make_log()
    before = events_for(5, 2)
    log.produce(before)
    time.sleep(0.03)
    middle = now_ms()
    time.sleep(0.03)
    after = events_for(5, 2)
    log.produce(after)

    with log.consumer("g") as consumer:
        assert drain(consumer, 20) and quiet(consumer) == []

        consumer.seek_to_timestamp(middle)
        replay = drain(consumer, len(after))
        assert quiet(consumer) == []
        assert sorted(ids(replay)) == sorted(e.event_id for e in after)
        assert all(c.log_ts >= middle for c in replay)

        consumer.seek_to_timestamp(now_ms() + 60_000)
        assert quiet(consumer) == [], "a time after the last record reads nothing"

        consumer.seek_to_beginning()
        everything = drain(consumer, 20)
        assert sorted(ids(everything)) == sorted(e.event_id for e in before + after)

        target = max(everything, key=lambda c: c.offset)
        consumer.seek([Position(target.partition, target.offset - 1)])
        again = drain(consumer, 2)
        assert quiet(consumer) == []
        assert [(c.partition, c.offset) for c in again] == [
            (target.partition, target.offset - 1),
            (target.partition, target.offset),
        ]
        assert consumer.lag() == {p: 0 for p in consumer.assignment()}


def test_poisoned_records_are_dead_lettered_and_consumption_goes_on(make_log: MakeLog) -> None:
    log = make_log(max_record_bytes=1024)
    good_before = make_event(user_id="victim")
    good_after = make_event(user_id="victim")
    missing_field = good_before.model_dump(mode="json")
    del missing_field["video_id"]
    unknown_type = good_before.model_dump(mode="json") | {"type": "teleport"}
    encoded = encode_event(good_before)
    repeated_user = encoded.replace(b'"user_id":', b'"user_id":"someone-else","user_id":', 1)
    poison = [
        (b"\xff\x00not json at all", "JSON"),
        (repeated_user, "user_id: key given twice"),  # parsers disagree on whose event it is
        (json.dumps(unknown_type).encode(), "teleport"),
        (json.dumps(missing_field).encode(), "video_id"),
        (b'{"padding": "' + b"x" * 2000 + b'"}', "max_record_bytes"),
    ]
    log.produce([good_before])
    for value, _ in poison:
        log.produce_raw(b"victim", value)
    log.produce([good_after])

    with log.consumer("g") as consumer:
        got = drain(consumer, 2)
        assert quiet(consumer) == []
    assert ids(got) == [good_before.event_id, good_after.event_id]

    letters = log.dead_letters()
    assert log.dead_letter_count() == len(poison) == len(letters)
    topic = events_topic(make_log.namespace)
    for letter, (value, word) in zip(letters, poison, strict=True):
        assert word in letter.reason
        assert letter.value == value and letter.key == b"victim"
        source_topic, partition, offset = letter.source.rsplit(":", 2)
        assert source_topic == topic
        assert int(partition) == got[0].partition
        assert got[0].offset < int(offset) < got[1].offset
    assert log.dead_letters(limit=2) == letters[:2]


@pytest.mark.faults
def test_a_bad_record_is_dead_lettered_once_per_group_naming_it_and_committed_past(
    make_log: MakeLog,
) -> None:
    """Two groups (the trainer's and the signal feed's) each dead-letter the bad record
    once, naming themselves; a bad record last in its partition is committed past
    (by explicit positions, as the trainer commits, and by ``commit()``, as the feed
    does), so a restarted member meets it no more."""
    log = make_log()
    good = make_event(user_id="victim")
    log.produce([good])
    log.produce_raw(b"victim", b"\xffbroken")
    log.produce_raw(b"victim", b"still broken")  # a run of two, last in the partition

    with log.consumer("trainer") as trainer, log.consumer("feed") as feed:
        first = drain(trainer, 1)
        assert ids(first) == [good.event_id] and quiet(trainer) == []
        trainer.commit([Position(first[0].partition, first[0].offset + 1)])  # what it trained
        assert ids(drain(feed, 1)) == [good.event_id] and quiet(feed) == []
        feed.commit()
        assert trainer.dead_lettered == feed.dead_lettered == 2
    letters = log.dead_letters()
    assert sorted(letter.group for letter in letters) == ["feed", "feed", "trainer", "trainer"]

    for group in ("trainer", "feed"):  # restarted members of both groups
        with log.consumer(group) as again:
            assert again.wait_for_assignment(10)
            assert quiet(again) == [] and quiet(again) == []
            assert again.dead_lettered == 0
            assert sum(again.lag().values()) == 0, "the bad records were not committed past"
    assert log.dead_letter_count() == 4


def test_a_member_reading_behind_its_groups_commit_skips_the_bad_records_there(
    make_log: MakeLog,
) -> None:
    """A restart's warm-up (the experiment feed seeks back by time) or a retrain seeking to
    its start again re-reads what the group passed: its bad records were dead-lettered
    then, and are not again; a group that never passed them dead-letters them once."""
    log = make_log()
    good = make_event(user_id="victim")
    log.produce([good])
    log.produce_raw(b"victim", b"\xffbroken")
    with log.consumer("feed") as feed:
        first = drain(feed, 1)
        assert ids(first) == [good.event_id] and quiet(feed) == []
        feed.commit([Position(first[0].partition, first[0].offset + 1)])  # and past the bad one
    assert log.dead_letter_count() == 1
    with log.consumer("feed") as again:
        assert again.wait_for_assignment(10)
        again.seek_to_beginning()
        assert ids(drain(again, 1)) == [good.event_id] and quiet(again) == []
        assert again.dead_lettered == 0
    with log.consumer("another") as other:  # never passed it: its own entry, once
        assert ids(drain(other, 1)) == [good.event_id] and quiet(other) == []
        assert other.dead_lettered == 1
    assert sorted(letter.group for letter in log.dead_letters()) == ["another", "feed"]


def test_lag_counts_unconsumed_records(make_log: MakeLog) -> None:
    log = make_log()
    log.produce(events_for(10, 3))
    with log.consumer("g") as consumer:
        assert consumer.wait_for_assignment(10) == list(range(PARTITIONS))
        assert sum(consumer.lag().values()) == 30
        assert len(drain(consumer, 10)) == 10
        assert sum(consumer.lag().values()) == 20
        log.produce(events_for(2, 1))
        assert sum(consumer.lag().values()) == 22
        assert len(drain(consumer, 22)) == 22
        assert consumer.lag() == {p: 0 for p in range(PARTITIONS)}


def test_poll_waits_for_records_and_wakes_when_they_arrive(make_log: MakeLog) -> None:
    log = make_log()
    event = make_event()
    with log.consumer("g") as consumer:
        assert consumer.wait_for_assignment(10) == list(range(PARTITIONS))
        started = time.monotonic()
        assert consumer.poll(10, 0) == []
        assert time.monotonic() - started < 0.5, "timeout 0 does not wait"
        producer = threading.Timer(0.3, log.produce, args=([event],))
        producer.start()
        started = time.monotonic()
        got = consumer.poll(10, 10)
        producer.join()
    assert ids(got) == [event.event_id]
    assert time.monotonic() - started < 5, "woken by the record, not by the timeout"


def test_closed_log_refuses_work(make_log: MakeLog) -> None:
    log = make_log()
    consumer = log.consumer("g")
    log.close()
    with pytest.raises(EventLogUnavailable):
        log.produce([make_event()])
    with pytest.raises(EventLogUnavailable):
        consumer.poll(1, 0)


@pytest.mark.kafka
def test_unreachable_kafka_fails_fast() -> None:
    settings = Settings(
        event_log=EventLogSettings(backend="kafka"),
        kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000),
    )
    started = time.monotonic()
    with pytest.raises(EventLogUnavailable):
        open_event_log(settings)
    assert time.monotonic() - started < 5


@pytest.mark.kafka
def test_a_second_kafka_log_on_existing_topics_shares_them(kafka_broker: TansuBroker) -> None:
    make_log = MakeLog("kafka", kafka_broker.bootstrap)
    try:
        first = make_log()
        first.produce(events_for(3, 2))
        second = make_log()  # the topics exist now: creation must tolerate that
        assert second.end_offsets() == first.end_offsets()
        assert sum(second.end_offsets().values()) == 6
    finally:
        for log in make_log.opened:
            log.close()


def wait_until_stopped(pid: int, timeout_s: float = 10) -> None:
    """Until every thread of ``pid`` is stopped (SIGSTOP reaches a busy thread a moment
    later: until then it may still answer a request)."""
    deadline = time.monotonic() + timeout_s
    tasks = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(tasks):
            with open(f"{tasks}/{task}/stat") as fh:
                states.append(fh.read().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


@pytest.mark.kafka
def test_a_silent_broker_is_marked_down_only_after_its_whole_budget_and_probed_back() -> None:
    """A produce that gave up at its caller's nearer deadline says nothing of the broker
    (under load that refused the next posts too); one that waited the whole
    ``produce_timeout_ms`` does. While down every produce is refused at once, none is a
    trial paying the budget, and a background probe brings the log back."""
    with TansuBroker() as broker:
        settings = Settings(
            event_log=EventLogSettings(backend="kafka", topic_namespace="silent"),
            kafka=KafkaSettings(bootstrap_servers=broker.bootstrap, partitions=2,
                                produce_timeout_ms=500, **GROUP_TIMINGS),
        )
        log = open_event_log(settings)
        try:
            log.produce([make_event()], timeout_s=10)  # connected, metadata known
            assert broker.process is not None
            os.kill(broker.process.pid, signal.SIGSTOP)  # up, but answers nothing
            try:
                wait_until_stopped(broker.process.pid)
                with pytest.raises(EventLogUnavailable):
                    log.produce([make_event()], timeout_s=0.1)
                assert log.breaker.up
                with pytest.raises(EventLogUnavailable):
                    log.produce([make_event()], timeout_s=0.5)
                assert not log.breaker.up
                refused = 0
                window = time.monotonic() + 1.0  # half-open trials came every 0.25 s
                while time.monotonic() < window:
                    with pytest.raises(EventLogUnavailable, match="the broker is down"):
                        log.produce([make_event()], timeout_s=0.5)
                    refused += 1
                assert refused > 10
            finally:
                os.kill(broker.process.pid, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while not log.breaker.up and time.monotonic() < deadline:
                time.sleep(0.05)
            assert log.breaker.up, "the probe did not bring the broker back"
            log.produce([make_event()], timeout_s=10)
        finally:
            log.close()


def _threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def _wait(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.mark.kafka
def test_a_background_connect_refuses_at_once_and_ends_with_close() -> None:
    """The service's log (``wait=False``) answers while no broker does, and its
    connecting thread (a ``Worker``) ends once the log is closed."""
    settings = Settings(
        event_log=EventLogSettings(backend="kafka"),
        kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000),
    )
    log = open_event_log(settings, wait=False)
    with pytest.raises(EventLogUnavailable, match="not connected"):
        log.produce([make_event()])
    assert not log.breaker.up  # type: ignore[attr-defined]
    log.close()
    _wait(lambda: not _threads_named("vidrec-kafka-connect"))


@pytest.mark.kafka
def test_a_background_connect_reaches_the_broker(kafka_broker: TansuBroker) -> None:
    settings = Settings(
        event_log=EventLogSettings(backend="kafka", topic_namespace=f"bg{uuid.uuid4().hex[:8]}"),
        kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap),
    )
    log = open_event_log(settings, wait=False)
    try:
        consumer = log.consumer("bg")  # waits for the connection (consumers run in threads)
        consumer.close()
        _wait(lambda: log.breaker.up)  # type: ignore[attr-defined]
        log.produce([make_event()])
    finally:
        log.close()
    _wait(lambda: not _threads_named("vidrec-kafka-connect"))
