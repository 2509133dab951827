"""Per-user feedback: the same behaviour from the memory and the Redis backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from feature_store.signals.feedback import (
    FeedbackParams,
    MemoryFeedback,
    RedisFeedback,
    ServedBatch,
)
from tests.factories import BASE_TS, make_event

WINDOW_MS = 60_000
PARAMS = FeedbackParams(served_window_ms=WINDOW_MS, served_max=3, dislikes_max=2)

Feedback = MemoryFeedback | RedisFeedback


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def feedback(request: pytest.FixtureRequest) -> Iterator[Feedback]:
    if request.param == "memory":
        yield MemoryFeedback(PARAMS)
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield RedisFeedback(client, PARAMS)
    client.close()


def test_served_videos_count_within_the_window_only(feedback: Feedback) -> None:
    feedback.record_served([ServedBatch("u1", BASE_TS, ["a", "b"])])
    assert feedback.read("u1", BASE_TS + 1000).served == {"a": BASE_TS, "b": BASE_TS}
    assert feedback.read("u1", BASE_TS + WINDOW_MS).served == {"a": BASE_TS, "b": BASE_TS}
    assert feedback.read("u1", BASE_TS + WINDOW_MS + 1).served == {}
    assert feedback.read("u2", BASE_TS).served == {}


def test_serving_again_moves_the_time_forward_never_back(feedback: Feedback) -> None:
    feedback.record_served([ServedBatch("u1", BASE_TS + 5000, ["a"])])
    feedback.record_served([ServedBatch("u1", BASE_TS, ["a"])])  # a late, older record
    assert feedback.read("u1", BASE_TS + 5000).served == {"a": BASE_TS + 5000}


def test_an_engagement_clears_a_served_video_a_skip_does_not(feedback: Feedback) -> None:
    feedback.record_served([ServedBatch("u1", BASE_TS, ["a", "b", "c"])])
    feedback.record_events(
        [
            make_event(user_id="u1", video_id="a", type="play", ts=BASE_TS + 10),
            make_event(user_id="u1", video_id="b", type="skip", ts=BASE_TS + 10),
            make_event(user_id="u2", video_id="c", type="like", ts=BASE_TS + 10),
        ],
        {},
    )
    assert set(feedback.read("u1", BASE_TS + 20).served) == {"b", "c"}


def test_served_entries_are_bounded_per_user_newest_kept(feedback: Feedback) -> None:
    for i, video in enumerate(["a", "b", "c", "d", "e"]):
        feedback.record_served([ServedBatch("u1", BASE_TS + i, [video])])
    assert set(feedback.read("u1", BASE_TS + 10).served) == {"c", "d", "e"}
    # A write drops what fell out of the window, so a user holds at most one window.
    feedback.record_served([ServedBatch("u1", BASE_TS + WINDOW_MS + 4, ["f"])])
    assert set(feedback.read("u1", BASE_TS).served) == {"e", "f"}


def test_dislikes_keep_the_video_and_its_creator(feedback: Feedback) -> None:
    feedback.record_events(
        [
            make_event(user_id="u1", video_id="a", type="dislike", ts=BASE_TS),
            make_event(user_id="u1", video_id="x", type="dislike", ts=BASE_TS + 5),
        ],
        {"a": "c1"},  # x's creator is unknown (not in the catalog)
    )
    view = feedback.read("u1", BASE_TS + 10)
    assert view.disliked == {"a": BASE_TS, "x": BASE_TS + 5}
    assert view.disliked_creators == {"c1": BASE_TS}
    assert feedback.read("u2", BASE_TS).disliked == {}


def test_dislikes_are_bounded_per_user_newest_kept(feedback: Feedback) -> None:
    events = [
        make_event(user_id="u1", video_id=v, type="dislike", ts=BASE_TS + i)
        for i, v in enumerate(["a", "b", "c"])
    ]
    feedback.record_events(events, {"a": "c1", "b": "c2", "c": "c3"})
    view = feedback.read("u1", BASE_TS + 10)
    assert set(view.disliked) == {"b", "c"}
    assert set(view.disliked_creators) == {"c2", "c3"}


def test_memory_snapshot_restores_everything(tmp_path: Path) -> None:
    first = MemoryFeedback(PARAMS, snapshot_dir=tmp_path)
    first.record_served([ServedBatch("u1", BASE_TS, ["a"])])
    first.record_events([make_event(user_id="u1", video_id="b", type="dislike")], {"b": "c1"})
    first.close()
    second = MemoryFeedback(PARAMS)
    second.restore(tmp_path)
    assert second.read("u1", BASE_TS + 1) == first.read("u1", BASE_TS + 1)
    assert second.read("u1", BASE_TS + 1).served == {"a": BASE_TS}


def test_memory_forgets_users_whose_entries_all_expired() -> None:
    feedback = MemoryFeedback(PARAMS)
    for i in range(1500):
        feedback.record_served([ServedBatch(f"old{i}", BASE_TS, ["a"])])
    for i in range(1500):
        feedback.record_served([ServedBatch(f"new{i}", BASE_TS + 2 * WINDOW_MS, ["a"])])
    assert len(feedback._served) <= 1500 + 1024
    assert not any(user.startswith("old") for user in feedback._served)


def test_a_positive_engagement_with_a_disliked_creator_lifts_the_demotion(
    feedback: Feedback,
) -> None:
    creators = {"a": "c1", "b": "c1", "c": "c1", "d": "c2"}
    feedback.record_events(
        [make_event(user_id="u1", video_id="a", type="dislike", ts=BASE_TS),
         make_event(user_id="u1", video_id="d", type="dislike", ts=BASE_TS)],
        creators,
    )
    # A short play is no evidence; a finish of another c1 video is.
    feedback.record_events(
        [make_event(user_id="u1", video_id="b", type="play", watch_ms=1000, ts=BASE_TS + 1)],
        creators,
    )
    assert set(feedback.read("u1", BASE_TS + 2).disliked_creators) == {"c1", "c2"}
    feedback.record_events(
        [make_event(user_id="u1", video_id="c", type="finish", watch_ms=60_000,
                    ts=BASE_TS + 3)],
        creators,
    )
    view = feedback.read("u1", BASE_TS + 4)
    assert set(view.disliked_creators) == {"c2"}
    assert set(view.disliked) == {"a", "d"}  # the disliked videos stay disliked
    # Within one batch, the order of the events decides.
    feedback.record_events(
        [make_event(user_id="u1", video_id="c", type="like", ts=BASE_TS + 5),
         make_event(user_id="u1", video_id="b", type="dislike", ts=BASE_TS + 6)],
        creators,
    )
    assert feedback.read("u1", BASE_TS + 7).disliked_creators["c1"] == BASE_TS + 6
