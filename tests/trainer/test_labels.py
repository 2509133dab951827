"""Label policy and the bounded online joiner."""

from __future__ import annotations

import numpy as np
import pytest

from feature_store.events import Event, EventContext
from feature_store.settings import FeatureSettings, TrainerSettings
from tests.factories import make_event
from trainer.labels import Joiner, LabelPolicy, Moments, Sample

SETTINGS = TrainerSettings()
POSITIVE = 0.5


def policy(settings: TrainerSettings = SETTINGS) -> LabelPolicy:
    return LabelPolicy(
        settings, FeatureSettings(positive_watch_ratio=POSITIVE, short_watch_ratio=0.1)
    )


def observe(joiner: Joiner, events: list[Event], partitions: list[int]) -> list[Sample]:
    """``joiner.observe`` whose feature values name the moment: the event's own timestamp."""
    asked: list[list[int]] = []

    def moments(positions: list[int]) -> Moments:
        asked.append(positions)
        values = np.array([[events[i].ts] for i in positions], dtype=np.uint64)
        return Moments(values, np.full(len(positions), 0.25))

    samples = joiner.observe(events, partitions, {}, moments)
    assert len(asked) <= 1  # one read of the stores per batch
    return samples


def moment(sample: Sample) -> int:
    """The timestamp of the moment whose features ``sample`` trains on."""
    return int(sample.values[0])


@pytest.mark.parametrize(
    ("kind", "watch_ms", "expected"),
    [
        ("finish", 60_000, 1.0),
        ("like", 0, 1.0),
        ("share", 0, 1.0),
        ("skip", 0, 0.0),
        ("dislike", 0, 0.0),
        ("play", 30_000, 1.0),  # ratio 0.5: at the threshold
        ("play", 29_000, None),  # between short and positive: ambiguous
        ("play", 5_000, 0.0),  # ratio 0.083: a short play
        ("click", 0, None),
        ("progress", 10_000, None),
    ],
)
def test_policy_labels_each_event_type(kind: str, watch_ms: int, expected: float | None) -> None:
    event = make_event(type=kind, watch_ms=watch_ms, duration_ms=60_000)
    assert policy().label(event) == expected


def test_play_without_duration_uses_catalog_length_or_gives_no_label() -> None:
    event = make_event(type="play", watch_ms=50_000, duration_ms=None)
    labels = policy()
    assert labels.label(event) is None
    assert labels.label(event, duration_ms=60_000) == 1.0


def test_sample_weights_per_event_type() -> None:
    joiner = Joiner(policy(TrainerSettings(sample_weights={"like": 2.0})), 1_000, 10)
    samples = observe(joiner, [make_event(type="like"), make_event(type="skip")], [0, 0])
    assert [s.weight for s in samples] == [2.0, 1.0]


def _joiner(window_ms: int = 10_000, max_entries: int = 100) -> Joiner:
    return Joiner(policy(), window_ms=window_ms, max_entries=max_entries)


def test_impression_followed_by_play_gives_only_the_plays_label() -> None:
    joiner = _joiner()
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a")
    play = make_event(type="play", ts=1_000_000_001_000, video_id="a", watch_ms=50_000)
    samples = observe(joiner, [imp, play], [0, 0])
    later = make_event(type="click", ts=1_000_000_100_000, video_id="zz")
    samples += observe(joiner, [later], [0])
    assert [(s.event.type, s.label) for s in samples] == [("play", 1.0)]
    assert len(joiner) == 0


def test_impression_without_play_times_out_into_a_negative() -> None:
    joiner = _joiner(window_ms=10_000)
    ctx = EventContext(position=3, surface="home")
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a", context=ctx)
    assert observe(joiner, [imp], [0]) == []
    # 9 s later in event time: still waiting
    click = make_event(type="click", ts=1_000_000_009_000, video_id="b")
    assert observe(joiner, [click], [0]) == []
    # 11 s later: expired into a negative carrying the impression's context
    out = observe(joiner, [make_event(type="click", ts=1_000_000_011_000, video_id="c")], [0])
    got = [(s.event.event_id, s.label, s.context.position) for s in out]
    assert got == [(imp.event_id, 0.0, 3)]
    assert joiner.expired == 1


def test_expiry_clock_is_per_partition() -> None:
    joiner = _joiner(window_ms=10_000)
    imp = make_event(type="impression", ts=1_000_000_000_000)
    observe(joiner, [imp], [0])
    far = make_event(type="click", ts=1_000_000_900_000, user_id="other")
    assert observe(joiner, [far], [1]) == []  # partition 1's clock does not expire partition 0
    assert len(joiner) == 1


def test_joiner_is_bounded_and_resolves_the_oldest_early() -> None:
    joiner = _joiner(window_ms=10**9, max_entries=3)
    imps = [make_event(type="impression", video_id=f"v{i}") for i in range(5)]
    out = observe(joiner, imps, [i % 2 for i in range(5)])
    assert len(joiner) == 3
    assert [s.event.event_id for s in out] == [imps[0].event_id, imps[1].event_id]
    assert all(s.label == 0.0 for s in out) and joiner.evicted == 2


def test_engagement_inherits_the_impressions_context() -> None:
    joiner = _joiner()
    ctx = EventContext(position=2, surface="home", device="tv")
    imp = make_event(type="impression", video_id="a", context=ctx)
    click = make_event(type="click", video_id="a")
    play = make_event(type="play", video_id="a", watch_ms=60_000, context=EventContext(os="ios"))
    (sample,) = observe(joiner, [imp, click, play], [0, 0, 0])
    assert (sample.context.position, sample.context.device, sample.context.os) == (2, "tv", "ios")


def test_flush_idle_expires_by_wall_clock() -> None:
    joiner = _joiner(window_ms=10_000)
    imp = make_event(type="impression")
    observe(joiner, [imp], [0])
    assert [s.label for s in joiner.flush_idle(imp.ts + 20_000)] == [0.0]


def test_idle_flush_does_not_expire_later_old_events() -> None:
    """A replay of old events after an idle spell still joins by event time."""
    joiner = _joiner(window_ms=10_000)
    first = make_event(type="impression", ts=999_000_000_000, video_id="z")
    observe(joiner, [first], [0])
    assert len(joiner.flush_idle(2_000_000_000_000)) == 1  # idle "now", far after the replay
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a")
    assert observe(joiner, [imp], [0]) == []
    play = make_event(type="play", ts=1_000_000_002_000, video_id="a", watch_ms=60_000)
    assert [(s.event.type, s.label) for s in observe(joiner, [play], [0])] == [("play", 1.0)]


def test_state_round_trip_keeps_pending_impressions() -> None:
    joiner = _joiner(window_ms=10_000)
    imp = make_event(type="impression", context=EventContext(position=1))
    observe(joiner, [imp], [2])
    restored = _joiner(window_ms=10_000)
    restored.load_state(*joiner.state())
    assert len(restored) == 1
    out = restored.flush_idle(imp.ts + 60_000)
    assert [(s.event.event_id, s.context.position) for s in out] == [(imp.event_id, 1)]


def test_a_timed_out_negative_trains_on_the_values_of_its_impression() -> None:
    joiner = _joiner(window_ms=10_000)
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a")
    observe(joiner, [imp], [0])
    later = make_event(type="click", ts=1_000_000_060_000, video_id="b")
    (negative,) = observe(joiner, [later], [0])
    assert negative.event.event_id == imp.event_id and negative.label == 0.0
    assert moment(negative) == imp.ts  # featurised when shown, not when it timed out


def test_an_engagement_trains_on_the_values_of_the_impression_it_follows() -> None:
    joiner = _joiner()
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a")
    finish = make_event(type="finish", ts=1_000_000_030_000, video_id="a", watch_ms=60_000)
    like = make_event(type="like", ts=1_000_000_031_000, video_id="a")
    samples = observe(joiner, [imp, finish], [0, 0])  # joined within one batch
    samples += observe(joiner, [like], [0])  # and in a later one
    assert [(s.event.type, moment(s)) for s in samples] == [("finish", imp.ts), ("like", imp.ts)]


def test_an_engagement_with_no_impression_is_featurised_at_its_own_moment() -> None:
    joiner = _joiner()
    finish = make_event(type="finish", ts=1_000_000_030_000, video_id="a", watch_ms=60_000)
    (sample,) = observe(joiner, [finish], [0])
    assert moment(sample) == finish.ts and joiner.own_moments == 1


def test_only_shown_moments_are_featurised() -> None:
    """Clicks, progress and joined engagements ask for no values of their own."""
    joiner = _joiner()
    imp = make_event(type="impression", video_id="a")
    events = [imp, make_event(type="click", video_id="a"),
              make_event(type="finish", video_id="a", watch_ms=60_000),
              make_event(type="progress", video_id="b", watch_ms=1_000)]
    asked: list[list[int]] = []

    def moments(positions: list[int]) -> Moments:
        asked.append(positions)
        return Moments(np.zeros((len(positions), 1), np.uint64), np.zeros(len(positions)))

    joiner.observe(events, [0] * 4, {}, moments)
    assert asked == [[0]]


def test_a_failed_featurisation_leaves_the_joiner_unchanged() -> None:
    """The loop retries a batch whose store reads failed: nothing may be half-applied."""
    joiner = _joiner()
    imp = make_event(type="impression", video_id="a")

    def broken(positions: list[int]) -> Moments:
        raise ConnectionError("redis down")

    with pytest.raises(ConnectionError):
        joiner.observe([imp], [0], {}, broken)
    assert len(joiner) == 0
    assert observe(joiner, [imp], [0]) == [] and len(joiner) == 1


def test_state_round_trip_keeps_the_values_of_remembered_impressions() -> None:
    joiner = _joiner(window_ms=10_000)
    imp = make_event(type="impression", ts=1_000_000_000_000, video_id="a")
    joined = make_event(type="impression", ts=1_000_000_000_500, video_id="b")
    play = make_event(type="play", ts=1_000_000_001_000, video_id="b", watch_ms=50_000)
    observe(joiner, [imp, joined, play], [0, 0, 0])
    restored = _joiner(window_ms=10_000)
    restored.load_state(*joiner.state())
    like = make_event(type="like", ts=1_000_000_002_000, video_id="b")
    assert [moment(s) for s in observe(restored, [like], [0])] == [joined.ts]
    assert [moment(s) for s in restored.flush_idle(imp.ts + 60_000)] == [imp.ts]
