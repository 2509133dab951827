"""What only the in-process log has: its files under the data dir, and retention."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from feature_store.errors import ConfigurationError
from feature_store.eventlog import MemoryEventLog, open_event_log
from feature_store.eventlog.base import ConsumedEvent, EventConsumer
from feature_store.settings import EventLogSettings, Settings
from tests.factories import make_event


def settings(**event_log: object) -> Settings:
    fields: dict[str, object] = {"memory_partitions": 4}
    fields.update(event_log)
    return Settings(event_log=EventLogSettings(**fields))  # type: ignore[arg-type]


def drain(consumer: EventConsumer, count: int) -> list[ConsumedEvent]:
    got: list[ConsumedEvent] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(count - len(got), 0.1)
    return got


def test_restart_keeps_records_offsets_and_dead_letters(tmp_path: Path) -> None:
    produced = [make_event(user_id=f"u{i % 7}") for i in range(30)]
    with open_event_log(settings(), data_dir=tmp_path) as log:
        log.produce(produced)
        log.produce_raw(b"u1", b"garbage")
        consumer = log.consumer("trainer")
        done = drain(consumer, 12)
        consumer.commit()
        drain(consumer, 5)  # read, never committed: must come again after restart
        ends = log.end_offsets()
    assert (tmp_path / "vidrec" / "offsets.json").exists()

    with open_event_log(settings(), data_dir=tmp_path) as log:
        assert log.end_offsets() == ends
        with log.consumer("trainer") as consumer:
            rest = drain(consumer, 30 - 12)
            assert consumer.poll(10, 0.05) == []
        with log.consumer("fresh-group") as consumer:
            assert len(drain(consumer, 30)) == 30
        letters = log.dead_letters()
        assert len(letters) >= 1 and letters[0].value == b"garbage"
        log.produce([make_event(user_id="u1")])
        assert sum(log.end_offsets().values()) == 32, "offsets go on after a restart"

    assert {c.event.event_id for c in done} | {c.event.event_id for c in rest} == {
        e.event_id for e in produced
    }
    assert not {c.event.event_id for c in done} & {c.event.event_id for c in rest}


def test_a_torn_record_at_the_end_is_cut_off(tmp_path: Path) -> None:
    with MemoryEventLog(settings(memory_partitions=1), tmp_path) as log:
        log.produce([make_event() for _ in range(3)])
    segment = next((tmp_path / "p0000").glob("*.seg"))
    with open(segment, "ab") as handle:
        handle.write(b"\x00\x00\x00")  # a crash in the middle of a record header
    with MemoryEventLog(settings(memory_partitions=1), tmp_path) as log:
        assert log.end_offsets() == {0: 3}
        log.produce([make_event()])
        with log.consumer("g") as consumer:
            assert [c.offset for c in drain(consumer, 4)] == [0, 1, 2, 3]


def test_reopening_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    with MemoryEventLog(settings(memory_partitions=4), tmp_path):
        pass
    with pytest.raises(ConfigurationError, match="memory_partitions"):
        MemoryEventLog(settings(memory_partitions=8), tmp_path).start()


def test_retention_drops_old_records_and_offsets_keep_growing(tmp_path: Path) -> None:
    retention = 1000
    config = settings(memory_partitions=1, memory_retention_records=retention)
    with MemoryEventLog(config, tmp_path) as log:
        for _ in range(5):
            log.produce([make_event() for _ in range(500)])
        start, end = log.beginning_offsets()[0], log.end_offsets()[0]
        assert end == 2500
        assert retention <= end - start <= retention + retention // 16
        with log.consumer("g") as consumer:
            assert consumer.lag() == {0: end - start}
            first = drain(consumer, 1)[0]
            assert first.offset == start
        segments = sorted((tmp_path / "p0000").glob("*.seg"))
        assert int(segments[0].stem) <= start, "the segment holding the start is kept"
        assert int(segments[0].stem) > 0, "segments wholly before the start are deleted"

    with MemoryEventLog(config, tmp_path) as log:
        assert log.beginning_offsets()[0] <= start + retention // 16
        assert log.end_offsets()[0] == end
        log.produce([make_event()])
        assert log.end_offsets()[0] == end + 1


def test_partition_of_a_user_is_stable() -> None:
    """Pinned values: a salted ``hash()`` would change them in every process."""
    from feature_store.eventlog.codec import partition_for

    assert [partition_for(f"user-{i}".encode(), 8) for i in range(6)] == [0, 0, 1, 6, 0, 3]


def test_torn_dead_letter_file_is_repaired(tmp_path: Path) -> None:
    with MemoryEventLog(settings(memory_partitions=1), tmp_path) as log:
        log.produce_raw(b"u1", b"bad one")
        with log.consumer("g") as consumer:
            assert consumer.poll(10, 0.1) == []
    with open(tmp_path / "dead_letters.log", "ab") as handle:
        handle.write(b"\x00\x00\x00\x05ab")  # half a header
    with MemoryEventLog(settings(memory_partitions=1), tmp_path) as log:
        log.produce_raw(b"u1", b"bad two")
        with log.consumer("g2") as consumer:
            assert consumer.poll(10, 0.1) == []
    with MemoryEventLog(settings(memory_partitions=1), tmp_path) as log:
        assert [d.value for d in log.dead_letters()] == [b"bad one", b"bad one", b"bad two"]
        assert "body" in log.dead_letters()[0].reason


def test_concurrent_producers_and_members_lose_and_repeat_nothing() -> None:
    """Threads producing while two group members consume: each event once, users in order."""
    log = MemoryEventLog(settings(memory_partitions=4)).start()
    per_thread = 250

    def produce(thread: int) -> None:
        for i in range(per_thread):
            log.produce([make_event(user_id=f"t{thread}-u{i % 5}")])

    members = [log.consumer("g"), log.consumer("g")]
    got: list[list[ConsumedEvent]] = [[], []]

    def consume(index: int) -> None:
        deadline = time.monotonic() + 20
        while sum(map(len, got)) < 4 * per_thread and time.monotonic() < deadline:
            got[index] += members[index].poll(50, 0.05)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    threads += [threading.Thread(target=consume, args=(m,)) for m in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()

    everything = got[0] + got[1]
    assert len(everything) == 4 * per_thread == len({c.event.event_id for c in everything})
    assert got[0] and got[1]
    for user in {c.event.user_id for c in everything}:
        mine = [c for c in everything if c.event.user_id == user]
        numbers = [int(c.event.event_id[1:]) for c in sorted(mine, key=lambda c: c.offset)]
        assert numbers == sorted(numbers), "a user's events keep their produce order"


def test_produced_events_are_handed_over_without_decoding_when_they_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process shortcut: same events, same dead letters, bounded memory."""
    import feature_store.eventlog.memory as memory

    monkeypatch.setattr(memory, "DECODED_WINDOW", 4)
    config = settings(memory_partitions=1).model_copy(
        update={"limits": Settings().limits.model_copy(update={"max_watch_ms": 60_000})}
    )
    good = [make_event(user_id="u1", watch_ms=1_000 * i) for i in range(10)]
    over_limit = make_event(user_id="u1", watch_ms=90_000)  # a valid Event, refused by limits
    with open_event_log(config, data_dir=tmp_path) as log:
        log.produce([*good[:5], over_limit, *good[5:]])
        with log.consumer("trainer") as consumer:
            got = drain(consumer, 10)
        assert [c.event for c in got] == good
        # The newest 4 of the 11 records (the window) are the produced objects.
        assert [c.event is e for c, e in zip(got, good, strict=True)] == [False] * 6 + [True] * 4
        letters = log.dead_letters()
        assert len(letters) == 1 and "watch_ms" in letters[0].reason
    with open_event_log(config, data_dir=tmp_path) as log:  # reloaded from files: decoded
        with log.consumer("again") as consumer:
            again = drain(consumer, 10)
        assert [c.event for c in again] == good
        assert not any(c.event is e for c, e in zip(again, good, strict=True))
