"""The experiment feed counts every event once across a crash, on both checkpoint backends.

A first feed counts part of the stream, checkpoints, counts more and dies
without saving (its consumer gone, its state lost, as with kill -9); a second
feed resumes from the checkpoint (re-reading a window before it to rebuild
the open impressions) and the totals equal the hand count of the whole
stream, impressions whose events straddle the checkpoint included.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.experiments.checkpoints import open_checkpoints
from app.experiments.feed import POLL_RECORDS, ExperimentFeed
from app.experiments.tally import Totals, merged
from feature_store.events import Event, EventContext
from feature_store.experiments import ExperimentSpec, ExperimentStore
from feature_store.runtime.resources import Resources, open_resources
from feature_store.served import ServedArm, ServedItem, ServedRecord
from tests.app.conftest import make_settings
from tests.app.test_experiments import EXPERIMENT, hand_count

USERS = 300
CHECKPOINT_EVERY_S = 24 * 3600.0
"""The feed also checkpoints by itself every ``experiments.checkpoint_every_s`` (1 s by
default): on a busy machine the first feed's run took longer than that and saved its
progress before the crash, so the second rightly counted nothing (issue #22: "0 of 540").
This test controls its checkpoints."""


def served(rec: str, user: str, arm: str | None) -> ServedRecord:
    return ServedRecord(
        recommendation_id=rec, user_id=user, ts_ms=int(time.time() * 1000),
        model_version="main-20260101T000000-00000", schema_hash="s", context=EventContext(),
        items=tuple(ServedItem(f"v{k}", k, 0.5, "trending") for k in range(3)),
        request_values=np.zeros(2, np.uint64), item_values=np.zeros((3, 2), np.uint64),
        arm=None if arm is None else ServedArm("exp1", arm),
    )


def stream(users: int) -> tuple[list[ServedRecord], list[list[dict[str, Any]]]]:
    """Responses (a third outside the experiment) and three waves of events: impressions,
    then engagements, then late impressions of videos engaged with before (reordered)."""
    records: list[ServedRecord] = []
    waves: list[list[dict[str, Any]]] = [[], [], []]
    now = int(time.time() * 1000)
    for i in range(users):
        user, rec = f"user{i}", f"rec{i}"
        arm = (None, "a", "b")[i % 3]
        records.append(served(rec, user, arm))

        def event(
            n: int, kind: str, video: str, rec: str = rec, user: str = user, **fields: Any
        ) -> dict[str, Any]:
            return {"event_id": f"{rec}-{n}", "user_id": user, "video_id": video, "type": kind,
                    "ts": now - 10_000 + n, "recommendation_id": rec, **fields}

        waves[0] += [event(0, "impression", "v0"), event(1, "impression", "v1")]
        waves[1] += [event(2, "play", "v0", watch_ms=1000 * (i % 7))]
        if i % 2:
            waves[1] += [event(3, "finish", "v0", watch_ms=60_000), event(4, "click", "v2")]
        if i % 5 == 0:
            waves[1].append(event(5, "play", "v1", watch_ms=3_000))
        waves[2].append(event(6, "impression", "v2"))
    return records, waves


def arm_of(records: list[ServedRecord]) -> dict[str, str | None]:
    return {r.recommendation_id: r.arm.arm if r.arm else None for r in records}


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def resources(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Resources]:
    # Checkpoints when the test saves only: the crash must lose what came after its save.
    overrides: dict[str, Any] = {"experiments": {"checkpoint_every_s": CHECKPOINT_EVERY_S}}
    if request.param == "redis":
        overrides = {"redis": {"url": request.getfixturevalue("redis_url")},
                     "stores": {"backend": "redis"}}
    settings = make_settings(tmp_path / "data", **overrides)
    with open_resources(settings) as opened:
        yield opened


def run_until_idle(feed: ExperimentFeed, limit: int = 100) -> None:
    for _ in range(limit):
        before = feed.counted, sum(t.offset or 0 for t in feed.tallies.values())
        feed.step()
        if (feed.counted, sum(t.offset or 0 for t in feed.tallies.values())) == before:
            return


def test_a_crash_after_a_checkpoint_neither_loses_nor_repeats_an_event(
    resources: Resources,
) -> None:
    store = ExperimentStore(resources.registry.root)
    store.start(ExperimentSpec.model_validate(EXPERIMENT), "test", int(time.time() * 1000) - 1)
    checkpoints = open_checkpoints(resources)
    assert resources.served_log is not None
    records, waves = stream(USERS)
    resources.served_log.produce(records)
    resources.event_log.produce([Event.model_validate(e) for e in waves[0] + waves[1][:150]])

    first = ExperimentFeed(resources, store, checkpoints)
    first.step()  # one poll: at most POLL_RECORDS events of the first waves
    assert 0 < first.counted <= POLL_RECORDS
    first.save()
    at_checkpoint = first.counted
    resources.event_log.produce([Event.model_validate(e) for e in waves[1][150:] + waves[2]])
    run_until_idle(first)
    counted_before_crash = first.counted
    first._release(save=False)  # dies: progress since the checkpoint is lost

    second = ExperimentFeed(resources, store, checkpoints)
    run_until_idle(second)
    second.save()
    arms = arm_of(records)
    armed = sum(1 for wave in waves for e in wave if arms[e["recommendation_id"]] is not None)
    assert counted_before_crash == armed  # the first feed had counted everything...
    assert second.counted == armed - at_checkpoint  # ...the second, only what was lost
    totals = merged(list(checkpoints.load().values()))["exp1"]
    for arm in "ab":
        mine = [e for wave in waves for e in wave if arms[e["recommendation_id"]] == arm]
        assert totals[arm] == Totals(**hand_count(mine)), arm
    assert set(totals) == {"a", "b"}


def test_a_restarted_feed_does_not_dead_letter_again_what_its_warm_up_re_reads(
    resources: Resources,
) -> None:
    """The feed seeks back a window at every start; the bad records there were dead-lettered
    when it first passed them, and its commit after each checkpoint says so (issue #22)."""
    store = ExperimentStore(resources.registry.root)
    store.start(ExperimentSpec.model_validate(EXPERIMENT), "test", int(time.time() * 1000) - 1)
    checkpoints = open_checkpoints(resources)
    assert resources.served_log is not None
    records, waves = stream(6)
    resources.served_log.produce(records)
    resources.event_log.produce([Event.model_validate(e) for e in waves[0]])
    for user in range(6):
        resources.event_log.produce_raw(f"user{user}".encode(), b"\xffbroken")
    first = ExperimentFeed(resources, store, checkpoints)
    run_until_idle(first)
    first._release(save=True)
    assert resources.event_log.dead_letter_count() == 6

    second = ExperimentFeed(resources, store, checkpoints)
    resources.event_log.produce([Event.model_validate(e) for e in waves[1]])
    run_until_idle(second)
    second._release(save=True)
    assert second.counted > 0
    assert resources.event_log.dead_letter_count() == 6
