"""A group's sequence views, shared through Redis (trainer/sequence_share.py): every member
holds everyone's views in one order, only the exporter refits, Redis down loses nothing
of the member's own tower."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from feature_store.events import EventContext
from tests.factories import make_event
from tests.services import free_port
from tests.trainer.helpers import wait_until
from tests.trainer.test_sequence import SMALL, cycle_views
from trainer.labels import Sample
from trainer.sequence import SequenceTrainer
from trainer.sequence_share import SharedViews
from trainer.stages.base import Batch, Checkpoint
from trainer.stages.sequence import SequenceStage

pytestmark = pytest.mark.redis


def samples(views: list[tuple[str, str]]) -> list[Sample]:
    """A finish per view, labelled positive (what the join stage gives a chosen view)."""
    return [
        Sample(make_event(user_id=u, video_id=v, type="finish"), 1.0, 1.0, EventContext(),
               None, 0.5)  # type: ignore[arg-type]
        for u, v in views
    ]


def member(url: str, leads: bool) -> SequenceStage:
    client = redis.Redis.from_url(url)
    shared = SharedViews(client, "g1", max_views=10_000)
    return SequenceStage(SequenceTrainer(SMALL, seed=1), shared, lambda: leads)


def test_every_member_holds_every_view_and_only_the_exporter_refits(redis_url: str) -> None:
    exporter, other = member(redis_url, True), member(redis_url, False)
    views = cycle_views(12, 8)  # users u0..u11: even ones trained by one member, odd by the other
    try:  # each stage's refit thread reads the stream back
        exporter.process(Batch([], samples=samples([v for v in views if int(v[0][1:]) % 2 == 0])))
        other.process(Batch([], samples=samples([v for v in views if int(v[0][1:]) % 2 == 1])))
        for stage in (exporter, other):
            wait_until(lambda s=stage: s.trainer.count == len(views), 30, "every view read back")
            assert set(stage.trainer.views) == {f"u{i}" for i in range(12)}
        assert exporter.trainer.views == other.trainer.views  # same users, codes and order
        assert exporter.trainer.ids == other.trainer.ids
        wait_until(lambda: exporter.trainer.published is not None, 120, "the exporter's refit")
        assert other.trainer.due() and other.trainer.published is None  # due, but not its job
        assert exporter.status()["shared_views"]["read"] == len(views)
    finally:
        exporter.close()
        other.close()


def test_a_restart_reads_on_from_its_checkpoint(redis_url: str, tmp_path: Path) -> None:
    first = member(redis_url, True)
    first.process(Batch([], samples=samples([("a", "x"), ("a", "y")])))
    wait_until(lambda: first.trainer.count == 2, 30, "the views read back")
    first.close()
    first.save(Checkpoint(1, tmp_path, {}))
    assert first.shared is not None
    first.shared.publish([("b", "z")])

    again = member(redis_url, True)
    again.restore(Checkpoint(1, tmp_path, {}))
    again._read_shared()
    assert again.trainer.count == 3  # two restored, one read on; none twice
    assert [again.trainer.ids[c - 1] for c in again.trainer.views["a"]] == ["x", "y"]
    again.close()


def test_with_redis_down_the_member_keeps_its_own_views() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    shared = SharedViews(client, "g1", max_views=100)
    stage = SequenceStage(SequenceTrainer(SMALL, seed=1), shared, lambda: True)
    stage.process(Batch([], samples=samples([("a", "x"), ("a", "y")])))
    wait_until(lambda: shared.failures >= 2, 30, "the refit thread's read to fail too")
    assert stage.trainer.count == 2 and stage.trainer.ids == ["x", "y"]
    stage.close()
