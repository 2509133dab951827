"""A request's reads of the Redis stores as steps (:mod:`feature_store.sparse.steps`).

The serving path sends the history, the feedback and the co-visitation reads
together, before reading any reply (``app.recommender``): run so, each gives
what its plain read gives, and a Redis failure is the plain read's error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_store.activity import open_activity
from feature_store.activity.redis import RedisActivity
from feature_store.errors import StoreUnavailable
from feature_store.settings import Settings
from feature_store.signals import RedisSignals, SignalParams
from feature_store.signals.feedback import FeedbackParams, RedisFeedback, ServedBatch
from feature_store.sparse.steps import Rounds, run
from tests.factories import BASE_TS, make_event
from tests.services import free_port

pytestmark = pytest.mark.redis

SIGNALS = SignalParams(half_life_s=3600.0, window=5, neighbors=3, creator_videos=2)
FEEDBACK = FeedbackParams(served_window_ms=60_000, served_max=10, dislikes_max=10)


def stores(client: redis.Redis) -> tuple[RedisActivity, RedisFeedback, RedisSignals]:
    activity = open_activity(Settings(stores={"backend": "redis"}), redis_client=client)
    assert isinstance(activity, RedisActivity)
    return activity, RedisFeedback(client, FEEDBACK), RedisSignals(client, SIGNALS)


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def calls(client: redis.Redis) -> dict[str, int]:
    """Calls of each read command Redis has processed so far."""
    stats = client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("lrange", "zrangebyscore", "zrange", "zrevrange", "eval")}


def test_reads_sent_together_answer_what_the_plain_reads_answer(client: redis.Redis) -> None:
    activity, feedback, signals = stores(client)
    watches = [
        make_event(user_id=user, video_id=video, ts=BASE_TS + i, event_id=f"{user}-{video}")
        for i, (user, video) in enumerate(
            [("u1", "a"), ("u1", "b"), ("u2", "a"), ("u2", "c"), ("u3", "b"), ("u3", "c")]
        )
    ]
    activity.record(watches)
    signals.record(watches)
    feedback.record_served([ServedBatch("u1", BASE_TS, ["c", "d"])])
    feedback.record_events(
        [make_event(user_id="u1", video_id="e", type="dislike", ts=BASE_TS + 10)], {"e": "c9"}
    )
    now = BASE_TS + 1000
    before = calls(client)

    rounds = Rounds([
        activity.history_steps("u1"),
        feedback.read_steps("u1", now),
        signals.covisited_steps(["a", "b"], 10),
        activity.video_stats_matrix_steps(["a", "unknown", "c", "a"]),
    ])
    # Every read has sent its commands and none has read its reply yet; Redis runs them all.
    assert not rounds.done
    wanted = {"lrange": 1, "zrangebyscore": 1, "zrange": 2, "zrevrange": 2, "eval": 1}
    deadline = time.monotonic() + 10
    while any(calls(client)[k] - before[k] < n for k, n in wanted.items()):
        assert time.monotonic() < deadline, "the reads were not all sent at once"
        time.sleep(0.01)
    history, view, covisited, counters = rounds.finish()

    assert len(history) == 2 and history == activity.history("u1")
    assert view == feedback.read("u1", now)
    assert view.served == {"c": BASE_TS, "d": BASE_TS}
    assert view.disliked_creators == {"c9": BASE_TS + 10}
    assert covisited and covisited == signals.covisited(["a", "b"], 10)
    want = activity.video_stats_matrix(["a", "unknown", "c", "a"])
    assert counters.tolist() == want.tolist() and want[0].any() and not want[1].any()
    assert run([signals.covisited_steps([], 10)]) == [[]]


def test_a_redis_failure_is_the_plain_reads_error() -> None:
    # No retries: redis-py's default (backoff, three tries per command) only slows the test.
    down = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    activity, feedback, signals = stores(down)
    reads = [
        activity.history_steps("u1"),
        feedback.read_steps("u1", BASE_TS),
        signals.covisited_steps(["a"], 10),
    ]
    for read in reads:
        with pytest.raises(StoreUnavailable):
            run([read])
    down.close()


def test_the_sources_reads_sent_together_answer_what_the_plain_reads_answer(
    client: redis.Redis,
) -> None:
    """Trending, a category's and a creator's top videos and the newest uploads (two round
    trips: ids, then records), read as steps in one round: what the plain reads give."""
    from feature_store.catalog import open_catalog
    from tests.factories import make_video

    catalog = open_catalog(Settings(stores={"backend": "redis"}), redis_client=client)
    _, _, signals = stores(client)
    videos = [
        make_video(video_id=f"v{i}", creator_id=f"c{i % 2}", category=f"k{i % 3}",
                   uploaded_at=BASE_TS + i)
        for i in range(9)
    ]
    catalog.upsert(videos)
    catalog.upsert([videos[7].model_copy(update={"hidden": True})])
    signals.index_videos(videos)
    signals.record([
        make_event(user_id=f"u{i}", video_id=f"v{i % 5}", ts=BASE_TS + 100 + i,
                   event_id=f"e{i}", type="like")
        for i in range(12)
    ])

    got = run([
        signals.trending_steps(4),
        signals.category_videos_steps(["k0", "k1", "nothing"], 3),
        signals.creator_videos_steps(["c1", "c0"], 3),
        catalog.recent_steps(5, BASE_TS + 2),  # type: ignore[attr-defined]
        catalog.recent_steps(5, BASE_TS + 100),  # type: ignore[attr-defined]
    ])

    assert got[0] and got[0] == signals.trending(4)
    assert got[1] and got[1] == signals.category_videos(["k0", "k1", "nothing"], 3)
    assert got[2] and got[2] == signals.creator_videos(["c1", "c0"], 3)
    assert [v.video_id for v in got[3]] == ["v8", "v6", "v5", "v4", "v3"]  # v7 hidden
    assert got[3] == catalog.recent(5, BASE_TS + 2)
    assert got[4] == []
