"""Candidate signals: the same behaviour from the memory and the Redis backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from feature_store.activity.base import HistoryEntry
from feature_store.errors import StoreUnavailable
from feature_store.signals import MemorySignals, RedisSignals, SignalParams
from tests.factories import BASE_TS, make_event, make_video

PARAMS = SignalParams(half_life_s=3600.0, window=5, neighbors=3, creator_videos=2)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def signals(request: pytest.FixtureRequest) -> Iterator[MemorySignals | RedisSignals]:
    if request.param == "memory":
        yield MemorySignals(PARAMS, top_cache_ms=0)
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield RedisSignals(client, PARAMS)
    client.close()


def test_trending_ranks_recent_engagement_above_old(signals: MemorySignals | RedisSignals) -> None:
    old = [make_event(video_id="old", ts=BASE_TS, event_id=f"o{i}") for i in range(4)]
    # Five half-lives later, two plays outweigh four plays then.
    new_ts = BASE_TS + 5 * 3600 * 1000
    new = [make_event(video_id="new", ts=new_ts, event_id=f"n{i}") for i in range(2)]
    signals.record(old)
    signals.record(new)
    top = signals.trending(10)
    assert [v for v, _ in top] == ["new", "old"]
    assert top[0][1] == pytest.approx(1.0)
    assert top[1][1] == pytest.approx(4 / 2 / 32)


def test_impressions_and_skips_do_not_trend(signals: MemorySignals | RedisSignals) -> None:
    signals.record(
        [make_event(video_id="a", type="impression"), make_event(video_id="b", type="skip")]
    )
    assert signals.trending(10) == []


def test_rescale_keeps_ranking(signals: MemorySignals | RedisSignals) -> None:
    signals.record([make_event(video_id="a", ts=BASE_TS)])
    far = BASE_TS + 100 * 3600 * 1000  # 100 half-lives: forces a rescale
    signals.record([make_event(video_id="b", ts=far)])
    signals.record([make_event(video_id="c", ts=far), make_event(video_id="c", ts=far)])
    assert [v for v, _ in signals.trending(3)] == ["c", "b", "a"]


def test_category_trending_counts_within_each_category(
    signals: MemorySignals | RedisSignals,
) -> None:
    """What trends where a user's tastes lie: a category's own ranking, rescaled with the
    global one, a video leaving it when hidden or moved to another category."""
    videos = [make_video(video_id=v, category=c) for v, c in
              (("a1", "cars"), ("a2", "cars"), ("b1", "cats"), ("b2", "cats"))]
    signals.index_videos(videos)
    plays = {"a1": 1, "a2": 3, "b1": 2, "b2": 1, "unknown": 5}
    signals.record([make_event(video_id=v, ts=BASE_TS, event_id=f"{v}-{i}")
                    for v, n in plays.items() for i in range(n)])
    assert signals.category_videos(["cars"], 10) == ["a2", "a1"]
    assert signals.category_videos(["cats", "cars"], 3) == ["b1", "a2", "b2"]
    far = BASE_TS + 100 * 3600 * 1000  # forces a rescale: the order holds across it
    signals.record([make_event(video_id="a1", ts=far)])
    assert signals.category_videos(["cars"], 10) == ["a1", "a2"]
    signals.index_videos([videos[0].model_copy(update={"hidden": True}),
                          videos[3].model_copy(update={"category": "cars"})])
    assert signals.category_videos(["cars"], 10) == ["a2"]
    assert signals.category_videos(["cats"], 10) == ["b1"]
    assert signals.category_videos(["nothing"], 10) == []


def test_covisitation_pairs_new_visit_with_recent_visits(
    signals: MemorySignals | RedisSignals,
) -> None:
    history = {"u1": [HistoryEntry(video_id="h1", watch_ratio=1.0, ts=BASE_TS)]}
    signals.record([make_event(user_id="u1", video_id="x")], history)
    signals.record(
        [make_event(user_id="u2", video_id="h1"), make_event(user_id="u2", video_id="y")]
    )
    assert dict(signals.covisited(["x"], 10)) == {"h1": 1.0}
    assert dict(signals.covisited(["h1"], 10)) == {"x": 1.0, "y": 1.0}
    # A short play is a visit (the user clicked); a skip and an impression are not.
    signals.record([
        make_event(user_id="u3", video_id="h1"),
        make_event(user_id="u3", video_id="z", watch_ms=1000),
        make_event(user_id="u3", video_id="skipped", type="skip", watch_ms=0),
        make_event(user_id="u3", video_id="shown", type="impression", watch_ms=0),
    ])
    partners = dict(signals.covisited(["h1"], 10))
    assert set(partners) == {"x", "y", "z"}
    # h1 now has two visits: each partner's cosine is 1 / sqrt(2 * 1).
    assert partners["z"] == pytest.approx(2**-0.5)


def test_a_view_is_one_visit_however_many_events_it_sends(
    signals: MemorySignals | RedisSignals,
) -> None:
    """play, finish and like of one view pair once, whether they come in one batch or
    in several, and whether the history was read before or after the batch."""
    history = [HistoryEntry(video_id="h1", watch_ratio=1.0, ts=BASE_TS)]
    play = make_event(user_id="u1", video_id="x", ts=BASE_TS + 10)
    finish = make_event(user_id="u1", video_id="x", type="finish", ts=BASE_TS + 11)
    like = make_event(user_id="u1", video_id="x", type="like", ts=BASE_TS + 12)
    signals.record([play, finish], {"u1": history})
    after = [HistoryEntry(video_id="x", watch_ratio=1.0, ts=BASE_TS + 11), *history]
    signals.record([like], {"u1": after})  # the next batch: x was visited before it
    # One more visit of h1 elsewhere, with the history read after its batch was applied.
    signals.record([make_event(user_id="u2", video_id="h1", ts=BASE_TS + 20)],
                   {"u2": [HistoryEntry(video_id="h1", watch_ratio=1.0, ts=BASE_TS + 20)]})
    # x: one visit, paired once with h1 (one visit counted by the store).
    assert signals.covisited(["x"], 10) == [("h1", pytest.approx(1.0))]


def test_cosine_ranks_a_specific_partner_above_a_popular_one(
    signals: MemorySignals | RedisSignals,
) -> None:
    """The raw count would put the video everybody watches first; the cosine divides by
    the partner's visits, so what goes with the seed in particular comes first."""
    batch = []
    for n in range(3):
        batch += [make_event(user_id=f"a{n}", video_id="seed"),
                  make_event(user_id=f"a{n}", video_id="popular")]
    for n in range(2):
        batch += [make_event(user_id=f"b{n}", video_id="seed"),
                  make_event(user_id=f"b{n}", video_id="niche")]
    batch += [make_event(user_id=f"c{n}", video_id="popular") for n in range(20)]
    signals.record(batch)
    got = signals.covisited(["seed"], 10)
    assert [v for v, _ in got] == ["niche", "popular"]
    assert dict(got)["niche"] == pytest.approx(2 / (5 * 2) ** 0.5)
    assert dict(got)["popular"] == pytest.approx(3 / (5 * 23) ** 0.5)


def test_recent_visits_weigh_more(signals: MemorySignals | RedisSignals) -> None:
    """Seeds newest first, each position back weighing ``decay`` times less."""
    signals.record([
        make_event(user_id="a", video_id="old"), make_event(user_id="a", video_id="p"),
        make_event(user_id="b", video_id="new"), make_event(user_id="b", video_id="q"),
    ])
    got = dict(signals.covisited(["new", "old"], 10))
    assert got["q"] == pytest.approx(1.0)
    assert got["p"] == pytest.approx(PARAMS.decay)


def test_covisitation_keeps_strongest_neighbours(signals: MemorySignals | RedisSignals) -> None:
    batch = []
    for i, other in enumerate(["a", "b", "c", "d", "e", "f", "g", "h"]):
        for n in range(i + 1):
            user = f"u{other}{n}"
            batch += [
                make_event(user_id=user, video_id="x"),
                make_event(user_id=user, video_id=other),
            ]
    signals.record(batch)
    got = [v for v, _ in signals.covisited(["x"], 3)]
    assert got == ["h", "g", "f"]


def test_creator_videos_newest_first_and_hidden_removed(
    signals: MemorySignals | RedisSignals,
) -> None:
    a1, a2, a3 = (make_video(creator_id="ca") for _ in range(3))
    b1 = make_video(creator_id="cb")
    signals.index_videos([a1, a2, a3, b1])
    assert signals.creator_videos(["ca", "cb"], 10)[:3] == [a3.video_id, b1.video_id, a2.video_id]
    signals.index_videos([a3.model_copy(update={"hidden": True})])
    assert a3.video_id not in signals.creator_videos(["ca"], 10)


def test_memory_snapshot_round_trip(tmp_path: Path) -> None:
    first = MemorySignals(PARAMS, snapshot_dir=tmp_path)
    first.record([make_event(video_id="a"), make_event(user_id="u1", video_id="b")])
    first.index_videos([make_video(creator_id="c9", video_id="v9")])
    first.close()
    second = MemorySignals(PARAMS, top_cache_ms=0)
    second.restore(tmp_path)
    assert {v for v, _ in second.trending(5)} == {"a", "b"}
    assert second.covisited(["a"], 5) == [("b", 1.0)]  # the visits came back too
    assert second.creator_videos(["c9"], 5) == ["v9"]


@pytest.mark.redis
def test_redis_down_is_store_unavailable() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    signals = RedisSignals(client, PARAMS)
    with pytest.raises(StoreUnavailable):
        signals.trending(5)
    with pytest.raises(StoreUnavailable):
        signals.record([make_event()])
