"""The rebalance race of issue #22, played step by step: every record trained exactly once.

Two trainers of one group on one Redis (tables and stores), each with its own
data directory (journal, audit), driven batch by batch in this process: the
interleavings a rebalance makes are set up by hand (one member's stages run
up to a point, the other's batch runs, the first goes on), with a manual
clock for claim expiry, so nothing depends on timing. What is counted is what
``tests/production/test_scaling.py`` counts: the ids in each member's audit,
and the trainers' per-video counters against the events' own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from feature_store.activity.rules import stats_deltas
from feature_store.constants import TRAINING_VIDEO_STATS
from feature_store.eventlog.base import ConsumedEvent
from feature_store.events import Event
from feature_store.runtime.resources import Resources, open_resources
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld
from tests.factories import ManualClock
from tests.trainer.helpers import WORLD, wait_until
from trainer.loop import OnlineTrainer
from trainer.stages.base import Batch

pytestmark = pytest.mark.redis


def _settings(data_dir: Path, redis_url: str) -> Settings:
    return Settings(
        data_dir=data_dir,
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        trainer={"audit": True, "export_every_s": 0, "checkpoint_every_s": 3600},
    )


@pytest.fixture
def members(tmp_path: Path, redis_url: str) -> Iterator[tuple[OnlineTrainer, OnlineTrainer]]:
    """Trainers ``a`` and ``b`` of one group, on one manual clock (claims last 15 s)."""
    clock = ManualClock()
    with ExitStack() as stack:
        trainers = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            resources = stack.enter_context(open_resources(_settings(tmp_path / name, redis_url)))
            trainer = OnlineTrainer(resources)
            stack.callback(trainer.close)
            trainer.restore()
            assert trainer.group is not None
            trainer.group.member = name
            trainer.group._clock = clock
            trainers.append(trainer)
        yield trainers[0], trainers[1]


def _records(resources: Resources, count: int) -> list[ConsumedEvent]:
    """``count`` events in two partitions (alternating), offsets from 0 in each."""
    world = SyntheticWorld(WORLD)
    resources.catalog.upsert(world.videos())
    events = world.events(count)
    offsets: Counter[int] = Counter()
    records = []
    for i, event in enumerate(events):
        partition = i % 2
        records.append(ConsumedEvent(event, partition, offsets[partition], event.ts))
        offsets[partition] += 1
    return records


def _until_written(trainer: OnlineTrainer, records: list[ConsumedEvent]) -> Batch:
    """The decode stage of ``records``: claimed, the group's progress read."""
    return trainer.stages.decode.process(Batch(list(records)))


def _the_rest(trainer: OnlineTrainer, batch: Batch) -> Batch:
    for stage in trainer.stages.stages[1:]:
        batch = stage.process(batch)
    return batch


def _audited(trainer: OnlineTrainer) -> list[str]:
    trainer.checkpoint()
    root = trainer.resources.settings.data_dir / "trainer" / trainer.cfg.group_id
    return [i for p in sorted((root / "audit").glob("*.ids")) for i in p.read_text().split()]


def _counters_match(resources: Resources, events: list[Event]) -> None:
    """The trainers' per-video counters hold each event once."""
    client = resources.redis_client
    assert client is not None
    for video, delta in stats_deltas(events).items():
        raw = client.hgetall(TRAINING_VIDEO_STATS + video)
        stored = {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
        for name, amount in delta.increments.items():
            assert stored.get(name) == amount, (video, name, stored)


def test_the_new_owner_waits_for_the_batch_in_flight_then_skips_it(
    members: tuple[OnlineTrainer, OnlineTrainer],
) -> None:
    a, b = members
    records = _records(a.resources, 300)
    first, rest = records[:200], records[200:]
    batch = _until_written(a, first)  # a read the progress (none) and trains its batch...
    assert len(batch.events) == 200
    # ...while a rebalance gives b both partitions, from the last commit (offset 0).
    assert b.group is not None and a.group is not None
    late = threading.Thread(target=b.train_records, args=(first + rest,), daemon=True)
    late.start()
    wait_until(lambda: b.group is not None and b.group.busy_waits > 0, 30, "b to find them busy")
    _the_rest(a, batch)  # a pushes, records, raises the progress, releases the claims
    late.join(60)
    assert not late.is_alive()
    assert b.group.skipped == 200, "b skipped what a trained while it waited"
    by_a, by_b = _audited(a), _audited(b)
    assert sorted(by_a) == sorted(r.event.event_id for r in first)
    assert sorted(by_b) == sorted(r.event.event_id for r in rest)
    _counters_match(a.resources, [r.event for r in records])
    assert a.group.fenced == a.group.fenced_late == b.group.fenced_late == 0


def test_a_member_stalled_past_its_claim_drops_its_batch_before_writing(
    members: tuple[OnlineTrainer, OnlineTrainer],
) -> None:
    a, b = members
    records = _records(a.resources, 200)
    batch = _until_written(a, records)  # a claims and reads the progress, then stalls
    assert a.group is not None and b.group is not None
    a.group._clock.now += a.group.claim_ttl_s + 1  # type: ignore[attr-defined]
    b.train_records(records)  # the claims expired: b takes them and trains the batch
    after = _the_rest(a, batch)  # a wakes up: its fence refuses, nothing is written
    assert a.group.fenced == 1 and not after.records and not after.samples
    assert a.stages.progress.positions == {}, "no commit may pass the dropped records"
    assert all(r.event.event_id not in a.stages.decode.dedupe for r in records)
    assert _audited(a) == []
    assert sorted(_audited(b)) == sorted(r.event.event_id for r in records)
    _counters_match(a.resources, [r.event for r in records])
    # a polls them again later (it still owns a partition, say): the progress skips them.
    a.train_records(records)
    assert a.group.skipped == 200 and _audited(a) == []


def test_busy_partitions_are_given_back_to_the_consumer_and_trained_later(
    members: tuple[OnlineTrainer, OnlineTrainer],
) -> None:
    a, b = members
    resources = a.resources
    world = SyntheticWorld(WORLD)
    resources.catalog.upsert(world.videos())
    events = world.events(400)
    resources.event_log.produce(events)
    consumer = resources.event_log.consumer("fence-test")
    try:
        polled = consumer.poll(400, 5.0)
        assert len({r.partition for r in polled}) > 1
        busy = polled[0].partition
        assert b.group is not None and a.group is not None
        held = [r for r in polled if r.partition == busy]
        b.group.claim(held, [])  # nothing chosen: claims nothing
        b.group.claim(held, list(range(len(held))))  # b trains that partition now
        batch = a.train(Batch(list(polled), consumer))
        assert {r.partition for r in batch.records} == {r.partition for r in polled} - {busy}
        assert a.group.given_back == 1
        assert busy not in a.stages.progress.positions
        assert b.group.finish([]) == []  # b's batch ends (it trained none of them)
        again = consumer.poll(400, 5.0)  # the consumer was sought back to them
        assert [r.offset for r in again] == [r.offset for r in held]
        a.train(Batch(again, consumer))
    finally:
        consumer.close()
    assert sorted(_audited(a)) == sorted(e.event_id for e in events)
    _counters_match(resources, events)
