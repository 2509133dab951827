"""The group sync of several trainers (trainer/distributed.py), on a single Redis and a cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster
from torch import nn

from feature_store.errors import ConfigurationError
from feature_store.eventlog.base import ConsumedEvent
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from tests.factories import ManualClock, make_event
from tests.trainer.helpers import wait_until
from trainer.distributed import GroupSync, PartitionsBusy, dense_tensors, open_group_sync

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", "redis-cluster"])
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    if request.param == "redis":
        c: redis.Redis = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    else:
        c = RedisCluster.from_url(request.getfixturevalue("redis_cluster_url"))  # type: ignore[assignment]
    yield c
    c.close()


def consumed(partition: int, offsets: range) -> list[ConsumedEvent]:
    return [
        ConsumedEvent(make_event(event_id=f"p{partition}-{o}"), partition, o, 0) for o in offsets
    ]


def _kept(sync: GroupSync, batch: list[ConsumedEvent]) -> list[tuple[int, int]]:
    claimed = sync.claim(batch, list(range(len(batch))))
    return [(batch[i].partition, batch[i].offset) for i in claimed.kept]


def test_a_new_owner_skips_what_the_old_one_trained(client: redis.Redis) -> None:
    old, new = GroupSync(client, "g", member="old"), GroupSync(client, "g", member="new")
    first = consumed(0, range(0, 10)) + consumed(1, range(0, 4))
    assert _kept(old, first) == [(r.partition, r.offset) for r in first]
    assert old.finish(first) == []
    again = consumed(0, range(5, 8))
    _kept(old, again)
    assert old.finish(again) == []  # never lowers the offset
    # The partitions move (from the committed offsets, 6 and 0): the new owner
    # drops what the old one pushed after its commit.
    batch = consumed(0, range(6, 14)) + consumed(1, range(0, 6)) + consumed(2, range(0, 3))
    assert _kept(new, batch) == [
        (0, 10), (0, 11), (0, 12), (0, 13), (1, 4), (1, 5), (2, 0), (2, 1), (2, 2)
    ]  # fmt: skip
    assert new.skipped == len(batch) - 9
    assert new.finish(batch) == []
    assert {int(k): int(v) for k, v in client.hgetall(new.progress_key).items()} == {
        0: 14, 1: 6, 2: 3,
    }


def test_a_partition_being_trained_is_busy_for_the_others_until_finished(
    client: redis.Redis,
) -> None:
    a, b = GroupSync(client, "g", member="a"), GroupSync(client, "g", member="b")
    mine = consumed(0, range(0, 5))
    assert _kept(a, mine) == [(0, o) for o in range(5)]
    # b was given partition 0 in a rebalance while a trains: it waits for a's batch
    # (its records of partition 0 are given back), and trains partition 1 meanwhile.
    theirs = consumed(0, range(0, 8)) + consumed(1, range(0, 2))
    claimed = b.claim(theirs, list(range(len(theirs))))
    assert claimed.busy == {0} and [theirs[i].partition for i in claimed.kept] == [1, 1]
    assert b.finish([theirs[i] for i in claimed.kept]) == []
    with pytest.raises(PartitionsBusy):  # nothing free at all: the loop retries later
        b.claim(theirs[:8], list(range(8)))
    assert a.finish(mine) == []
    assert _kept(b, theirs[:8]) == [(0, 5), (0, 6), (0, 7)]  # after a's batch, only the rest
    assert b.finish(theirs[:8]) == [] and b.given_back == 1 and b.busy_waits == 1


def test_a_member_stalled_past_its_claim_is_fenced(client: redis.Redis) -> None:
    clock = ManualClock()
    a = GroupSync(client, "g", member="a", clock=clock, claim_ttl_s=3.0)
    b = GroupSync(client, "g", member="b", clock=clock, claim_ttl_s=3.0)
    batch = consumed(0, range(0, 5))
    _kept(a, batch)
    clock.now += 0.9
    assert a.fence(), "young claims are not even asked about"
    clock.now += 0.2
    assert a.fence()  # renewed in Redis: a third of the TTL had passed
    clock.now += 3.5  # a stalls: its claim expires and b takes the partition
    assert _kept(b, batch) == [(0, o) for o in range(5)]
    assert not a.fence() and a.fenced == 1, "a must drop its batch before writing"
    a.abandon()
    assert b.finish(batch) == []
    # The late case: a passed its fence, then stalled past the TTL before finishing.
    later = consumed(0, range(5, 9))
    _kept(a, later)
    assert a.fence()
    clock.now += 3.5
    assert _kept(b, later) == [(0, o) for o in range(5, 9)]
    assert a.finish(later) == [0] and a.fenced_late == 1, "refused: b holds the claim"
    assert int(client.hget(a.progress_key, "0")) == 5, "the refused finish moved nothing"
    assert b.finish(later) == []
    assert int(client.hget(a.progress_key, "0")) == 9


def test_a_finish_retried_after_a_lost_reply_is_not_refused(client: redis.Redis) -> None:
    a = GroupSync(client, "g", member="a")
    batch = consumed(3, range(0, 4))
    _kept(a, batch)
    held = dict(a._held)
    assert a.finish(batch) == []
    a._held = held  # the reply was lost: the loop's retry calls it again
    assert a.finish(batch) == [] and a.fenced_late == 0
    assert int(client.hget(a.progress_key, "3")) == 4


def test_one_member_holds_the_exporter_lease_until_it_leaves_or_dies(
    client: redis.Redis,
) -> None:
    first = GroupSync(client, "g", member="first", averaging=False, lease_ttl_s=0.5)
    second = GroupSync(client, "g", member="second", averaging=False, lease_ttl_s=0.5)
    assert first.leads() and not second.leads()
    assert not first.due(), "averaging is trainer.group_sync's"
    first.leave()  # a graceful stop frees it: the other takes it when it next asks
    assert _asks(second)
    # The holder dies (stops renewing): the lease expires and the other takes it.
    assert not _asks(first)
    wait_until(lambda: _asks(first), 10, "the lease to expire")
    assert first.status()["exporter"] is True and not _asks(second)


def _asks(sync: GroupSync) -> bool:
    """``leads()`` asking Redis, not the member's cache of its last answer."""
    sync._lease_checked = float("-inf")
    return sync.leads()


def test_the_towers_are_averaged_with_the_ranker(client: redis.Redis) -> None:
    clock = ManualClock()
    pairs = [nn.ModuleList([nn.Linear(3, 2), nn.Linear(4, 4)]) for _ in range(2)]
    for value, pair in enumerate(pairs):
        for t in dense_tensors(pair):
            torch.nn.init.constant_(t, float(value))
    syncs = [GroupSync(client, "g", member=f"m{i}", every_s=1.0, clock=clock) for i in range(2)]
    syncs[0].average(pairs[0], samples=1)
    assert syncs[1].average(pairs[1], samples=1) == 1
    assert all(torch.allclose(t, torch.full_like(t, 0.5)) for t in dense_tensors(pairs[1][1]))


def test_members_average_their_dense_networks(client: redis.Redis) -> None:
    clock = ManualClock()
    nets = [nn.Linear(3, 2), nn.Linear(3, 2), nn.Linear(3, 2)]
    for value, net in enumerate(nets):
        for t in dense_tensors(net):
            torch.nn.init.constant_(t, float(value))
    syncs = [GroupSync(client, "g", member=f"m{i}", every_s=1.0, clock=clock) for i in range(3)]
    assert not syncs[0].due()
    clock.now += 1.0
    assert syncs[0].due()
    assert syncs[0].average(nets[0], samples=10) == 0  # alone so far: unchanged
    assert float(nets[0].weight.detach().sum()) == 0.0
    assert syncs[1].average(nets[1], samples=10) == 1  # with m0: (0 + 1) / 2
    assert torch.allclose(nets[1].weight, torch.full((2, 3), 0.5))
    # Each member publishes before averaging: m2 sees m0's 0 and m1's 1.
    assert syncs[2].average(nets[2], samples=10) == 2
    assert torch.allclose(nets[2].bias, torch.full((2,), 1.0))
    assert not syncs[2].due()


def test_a_dead_member_drops_out_and_a_misshapen_one_is_ignored(client: redis.Redis) -> None:
    clock = ManualClock()
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    torch.nn.init.constant_(a.weight, 4.0)
    torch.nn.init.constant_(b.weight, 0.0)
    dead = GroupSync(client, "g", member="dead", every_s=1.0, clock=clock)
    alive = GroupSync(client, "g", member="alive", every_s=1.0, clock=clock)
    other = GroupSync(client, "g", member="other-shape", every_s=1.0, clock=clock)
    dead.average(a, samples=1)
    other.average(nn.Linear(4, 2), samples=1)
    clock.now += 3.5  # three periods without a word from "dead"
    other.average(nn.Linear(4, 2), samples=1)
    assert alive.average(b, samples=1) == 0, "stale and misshapen peers are not averaged"
    assert float(b.weight.detach().abs().sum()) == 0.0
    assert set(client.hkeys(alive.dense_key)) == {b"alive", b"other-shape"}  # stale deleted
    alive.leave()
    assert set(client.hkeys(alive.dense_key)) == {b"other-shape"}


def test_group_sync_needs_redis_sparse_tables(tmp_path: object) -> None:
    settings = Settings(data_dir=tmp_path, trainer={"group_sync": True})  # type: ignore[arg-type]
    with open_resources(settings) as resources, pytest.raises(ConfigurationError):
        open_group_sync(resources)


def test_average_keeps_the_dtype_and_shapes(client: redis.Redis) -> None:
    net = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    clock = ManualClock()
    GroupSync(client, "g", member="twin", clock=clock).average(net, samples=0)
    GroupSync(client, "g", member="me", clock=clock).average(net, samples=0)
    for key, value in net.state_dict().items():
        assert value.dtype == before[key].dtype and value.shape == before[key].shape
        np.testing.assert_allclose(value.numpy(), before[key].numpy(), rtol=1e-6)


def _settle(*syncs: GroupSync) -> None:
    """Wait for every member's gloo round in flight to end (success or failure)."""
    for sync in syncs:
        assert sync.gloo is not None
        thread = sync.gloo._thread
        if thread is not None:
            thread.join(30)
            assert not thread.is_alive()


def test_gloo_members_average_by_all_reduce(client: redis.Redis) -> None:
    clock = ManualClock()
    nets = [nn.Linear(3, 2), nn.Linear(3, 2)]
    for value, net in zip((0.0, 2.0), nets, strict=True):
        for t in dense_tensors(net):
            torch.nn.init.constant_(t, value)
    syncs = [
        GroupSync(client, "g", member=m, every_s=1.0, clock=clock, gloo_address="127.0.0.1")
        for m in ("a", "b")
    ]
    for _ in range(3):  # round 1 registers both; round 2 averages; round 3 applies it
        clock.now += 1.0
        for sync, net in zip(syncs, nets, strict=True):
            assert sync.due()
            with torch.no_grad():
                sync.average(net, samples=0)
        _settle(*syncs)
    for net in nets:
        assert torch.allclose(net.weight.detach(), torch.full((2, 3), 1.0)), net.weight
    assert all(s.syncs >= 1 and s.status()["dense_sync"] == "gloo" for s in syncs)


def test_a_gloo_round_with_a_dead_member_fails_without_blocking(client: redis.Redis) -> None:
    clock = ManualClock()
    net = nn.Linear(3, 2)
    before = net.weight.detach().clone()
    sync = GroupSync(client, "g", member="a", every_s=1.0, clock=clock, gloo_address="127.0.0.1")
    assert sync.gloo is not None
    ghost = json.dumps({"address": "127.0.0.1:1", "at": clock.now + 1})  # registered, gone
    client.hset(sync.gloo.members_key, "ghost", ghost)
    clock.now += 1.0
    started = time.monotonic()
    sync.average(net, samples=0)
    assert time.monotonic() - started < 0.5, "the loop never waits for a round"
    _settle(sync)
    assert sync.gloo.failures == 1 and sync.syncs == 0
    clock.now += 1.0
    sync.average(net, samples=0)  # nothing to apply from the failed round
    assert torch.equal(net.weight.detach(), before)
    _settle(sync)


def test_gloo_rounds_do_not_pile_up_in_the_leaders_store(client: redis.Redis) -> None:
    clock = ManualClock()
    nets = [nn.Linear(3, 2), nn.Linear(3, 2)]
    syncs = [
        GroupSync(client, "g", member=m, every_s=1.0, clock=clock, gloo_address="127.0.0.1")
        for m in ("a", "b")
    ]
    for _ in range(6):
        clock.now += 1.0
        for sync, net in zip(syncs, nets, strict=True):
            sync.average(net, samples=0)
        _settle(*syncs)
    leader = syncs[0].gloo
    assert leader is not None and leader.failures == 0
    assert leader._store.num_keys() <= 2 * 2 + 1  # two rounds' keys of two ranks, and a counter
