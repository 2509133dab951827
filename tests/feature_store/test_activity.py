"""The activity store: the same tests against the memory and the Redis backend."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_store.activity import (
    ActivityStore,
    HistoryEntry,
    MemoryActivity,
    RedisActivity,
    VideoStats,
    open_activity,
)
from feature_store.constants import HISTORY
from feature_store.errors import ConfigurationError, NotFound, StoreUnavailable
from feature_store.features.dense import STAT_FIELDS, stats_matrix
from feature_store.settings import Settings
from tests.factories import BASE_TS, make_event, make_video
from tests.services import free_port

BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]
REDIS_SETTINGS = Settings(stores={"backend": "redis"})  # type: ignore[arg-type]

OpenActivity = Callable[..., ActivityStore]


@pytest.fixture()
def open_store(request: pytest.FixtureRequest) -> Iterator[OpenActivity]:
    """Opens stores of a named backend with feature settings overridden by keywords."""
    clients: list[redis.Redis] = []
    stores: list[ActivityStore] = []

    def _open(backend: str, **features: Any) -> ActivityStore:
        settings: dict[str, Any] = {"stores": {"backend": backend}, "features": features}
        client = None
        if backend == "redis":
            client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
            clients.append(client)
        store = open_activity(Settings(**settings), redis_client=client)
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()
    for client in clients:
        client.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def store(backend: str, open_store: OpenActivity) -> ActivityStore:
    """Defaults: history of 50, watched (a positive) from a ratio of 0.5."""
    return open_store(backend)


def watch(video_id: str, ratio: float, ts: int, **overrides: Any) -> Any:
    """A play of ``ratio`` of a 100 s video at ``ts``."""
    fields = {"video_id": video_id, "watch_ms": int(ratio * 100_000), "duration_ms": 100_000}
    return make_event(ts=ts, **{**fields, **overrides})


def videos(history: list[HistoryEntry]) -> list[str]:
    return [entry.video_id for entry in history]


def test_history_is_newest_first(store: ActivityStore) -> None:
    store.record([watch("a", 0.5, 1_000), watch("b", 0.8, 2_000)])
    store.record([watch("c", 1.0, 3_000)])

    assert store.history("u1") == [
        HistoryEntry(video_id="c", watch_ratio=1.0, ts=3_000),
        HistoryEntry(video_id="b", watch_ratio=0.8, ts=2_000),
        HistoryEntry(video_id="a", watch_ratio=0.5, ts=1_000),
    ]
    assert videos(store.history("u1", limit=2)) == ["c", "b"]
    assert store.history("u1", limit=0) == []


def test_rewatch_moves_to_front_and_keeps_best_ratio(store: ActivityStore) -> None:
    store.record([watch("a", 0.9, 1_000), watch("b", 0.5, 2_000)])
    store.record([watch("a", 0.6, 3_000)])

    first, second = store.history("u1")
    assert (first.video_id, first.watch_ratio, first.ts) == ("a", 0.9, 3_000)
    assert second.video_id == "b"


def test_a_late_event_does_not_jump_ahead_of_newer_watches(store: ActivityStore) -> None:
    store.record([watch("b", 0.5, 2_000)])
    store.record([watch("a", 0.5, 1_000)])

    assert videos(store.history("u1")) == ["b", "a"]


def test_history_is_capped_at_history_length(backend: str, open_store: OpenActivity) -> None:
    store = open_store(backend, history_length=3)
    store.record([watch(f"v{i}", 0.5, 1_000 + i) for i in range(5)])
    store.record([watch("v9", 0.5, 2_000)])

    assert videos(store.history("u1")) == ["v9", "v4", "v3"]


def test_plays_enter_as_watched_or_short_by_their_ratio(store: ActivityStore) -> None:
    """From the positive ratio a play is watched; under the short ratio (a play, not a
    progress beat) a rejection; between the two it says nothing."""
    store.record(
        [
            watch("between", 0.49, 1_000),
            watch("exact", 0.5, 1_001),
            make_event(video_id="no-length", type="play", duration_ms=None, ts=1_002),
            make_event(video_id="catalog-length", duration_ms=None, watch_ms=40_000, ts=1_003),
            make_event(video_id="finished", type="finish", watch_ms=1, ts=1_004),
            watch("progressed", 0.05, 1_005, type="progress"),
            watch("progressed", 0.6, 1_006, type="progress"),
            watch("short", 0.05, 1_007),
        ],
        {"catalog-length": make_video(video_id="catalog-length", duration_ms=50_000)},
    )

    history = {e.video_id: (e.action, e.watch_ratio) for e in store.history("u1")}
    assert history == {
        "exact": ("play", 0.5), "catalog-length": ("play", 0.8), "finished": ("finish", 1.0),
        "progressed": ("play", 0.6), "short": ("short", 0.05),
    }
    assert [e.video_id for e in store.history("u1") if e.positive] == [
        "progressed", "finished", "catalog-length", "exact"
    ]


def test_every_action_enters_and_the_stronger_one_stays(store: ActivityStore) -> None:
    """Likes, shares, skips and dislikes enter; a video acted on again keeps the later
    time, the best ratio and the stronger action (a dislike beats everything, a positive
    beats a skip, a skip never demotes a watch)."""
    store.record([watch("a", 0.5, 1_000), watch("b", 0.7, 1_001)])
    store.record(
        [
            make_event(video_id="liked", type="like", ts=2_000),
            make_event(video_id="shared", type="share", ts=3_000),
            make_event(video_id="a", type="skip", ts=4_000),
            make_event(video_id="b", type="dislike", ts=4_001),
            make_event(video_id="seen", type="impression", ts=4_002),
            make_event(video_id="clicked", type="click", ts=4_003),
            make_event(video_id="skipped", type="skip", ts=4_004),
            make_event(video_id="skipped", type="skip", ts=4_005),
        ]
    )
    store.record([watch("skipped", 0.9, 5_000)])

    assert [(e.video_id, e.action, e.watch_ratio, e.ts) for e in store.history("u1")] == [
        ("skipped", "play", 0.9, 5_000),
        ("b", "dislike", 0.7, 4_001),
        ("a", "play", 0.5, 4_000),
        ("shared", "share", 1.0, 3_000),
        ("liked", "like", 1.0, 2_000),
    ]


def test_entries_carry_the_creator_and_category_of_the_catalog(store: ActivityStore) -> None:
    """What a sequence model reads of each entry without a catalog read per request; a
    video the catalog did not know keeps what an earlier entry had."""
    video = make_video(video_id="a", creator_id="c7", category="cars")
    store.record([watch("a", 0.9, 1_000), watch("x", 0.9, 1_001)], {"a": video, "x": None})
    store.record([make_event(video_id="a", type="like", ts=2_000)])

    entries = {e.video_id: (e.creator_id, e.category) for e in store.history("u1")}
    assert entries == {"a": ("c7", "cars"), "x": ("", "")}


def test_entries_written_before_actions_read_as_watches(backend: str, open_store: OpenActivity,
                                                       tmp_path: Path) -> None:
    """Histories (Redis lists, snapshots) written as ``[video, ratio, ts]`` triples."""
    directory = tmp_path / "old"
    directory.mkdir()
    (directory / "activity.jsonl").write_text(
        '{"user_id": "u1", "history": [["v2", 0.9, 2000], ["v1", 1.0, 1000]]}\n'
    )
    store = open_store(backend)
    store.restore(directory)

    assert [(e.video_id, e.action, e.positive) for e in store.history("u1")] == [
        ("v2", "play", True), ("v1", "play", True)
    ]


def test_counters_by_event_type(store: ActivityStore) -> None:
    kinds = ["impression", "impression", "click", "play", "finish", "like", "share", "skip"]
    store.record([make_event(type=kind, ts=1_000 + i, watch_ms=10) for i, kind in enumerate(kinds)])
    store.record(
        [
            make_event(type="progress", ts=5_000, watch_ms=50_000),
            make_event(type="dislike", ts=900),
            make_event(type="play", ts=2_000, watch_ms=7, user_id="u2"),
        ]
    )

    assert store.video_stats(["v1"]) == [
        VideoStats(
            impressions=2,
            clicks=1,
            plays=2,
            finishes=1,
            likes=1,
            shares=1,
            skips=1,
            dislikes=1,
            watch_ms=10 + 10 + 7,  # play and finish; progress adds no watch time
            last_ts=5_000,
        )
    ]
    assert store.video_stats(["v1"])[0].engagements == 5


def test_counters_stay_exact_under_concurrent_writers(store: ActivityStore) -> None:
    """Several trainers count the same video at once (per-user ownership does not cover it)."""

    def writer(n: int) -> None:
        for batch in range(20):
            store.record([make_event(user_id=f"u{n}", type="impression") for _ in range(10)])
            store.record([make_event(user_id=f"u{n}", video_id=f"w{n}-{batch}")])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert store.video_stats(["v1"])[0].impressions == 4 * 20 * 10
    assert [len(h) for h in store.histories([f"u{n}" for n in range(4)])] == [20] * 4


def test_unknown_users_and_videos_read_as_empty(store: ActivityStore) -> None:
    store.record([watch("a", 0.5, 1_000)])

    assert store.history("nobody") == []
    assert store.histories(["nobody", "u1", "nobody2"]) == [[], store.history("u1"), []]
    assert store.histories([]) == []
    assert store.video_stats(["unknown", "a"])[0] == VideoStats()
    assert store.video_stats(["unknown", "a"])[1].plays == 1
    assert store.video_stats([]) == []


def test_counters_as_a_matrix_are_the_counters_objects(store: ActivityStore) -> None:
    store.record([watch("a", 0.5, 1_000), watch("b", 1.0, 2_500), watch("a", 0.9, 3_000)])
    ids = ["a", "unknown", "b", "a"]

    got = store.video_stats_matrix(ids)

    assert got.shape == (4, len(STAT_FIELDS))
    assert got.tolist() == stats_matrix(store.video_stats(ids)).tolist()
    assert got[0, STAT_FIELDS.index("last_ts")] == 3_000
    assert not got[1].any()
    assert store.video_stats_matrix([]).shape == (0, len(STAT_FIELDS))


def test_a_batch_applies_in_ts_order_and_each_event_once(store: ActivityStore) -> None:
    late = watch("c", 0.5, 3_000)
    store.record([late, watch("a", 0.5, 1_000), watch("b", 0.5, 2_000), late])

    assert videos(store.history("u1")) == ["c", "b", "a"]
    assert store.video_stats(["c"])[0].plays == 1


def test_histories_of_several_users(store: ActivityStore) -> None:
    store.record([watch("a", 0.5, 1_000, user_id="x"), watch("b", 0.5, 1_000, user_id="y")])

    assert [videos(h) for h in store.histories(["y", "x"])] == [["b"], ["a"]]


@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("target", BACKENDS)
def test_snapshot_restores_into_any_backend(
    source: str, target: str, open_store: OpenActivity, tmp_path: Path
) -> None:
    src = open_store(source)
    src.record([watch("a", 0.5, 1_000), watch("b", 0.75, 2_000, user_id="u2")])
    src.record([make_event(video_id="a", type="impression", ts=BASE_TS)])
    histories, stats = src.histories(["u1", "u2"]), src.video_stats(["a", "b"])
    src.snapshot(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["activity.jsonl"]  # no temp file left
    # Restoring must make the target equal to the snapshot, whatever it held.
    dst = src if target == source else open_store(target)
    dst.record([watch("a", 0.9, 5_000, user_id="u3"), watch("z", 0.9, 5_000)])

    dst.restore(tmp_path)

    assert dst.histories(["u1", "u2", "u3"]) == [*histories, []]
    assert dst.video_stats(["a", "b", "z"]) == [*stats, VideoStats()]


def test_restore_without_a_snapshot_is_not_found(store: ActivityStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        store.restore(tmp_path)


@pytest.mark.redis
def test_redis_histories_expire_when_idle(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = open_activity(REDIS_SETTINGS, redis_client=client)
    store.record([watch("a", 0.5, 1_000)])

    assert 89 * 86_400 < client.ttl(HISTORY + "u1") <= 90 * 86_400
    client.close()


@pytest.mark.redis
def test_the_factory_opens_the_configured_backend(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert isinstance(open_activity(Settings()), MemoryActivity)
        assert isinstance(open_activity(REDIS_SETTINGS, redis_client=client), RedisActivity)
        with pytest.raises(ConfigurationError, match="stores.backend"):
            open_activity(REDIS_SETTINGS)
    finally:
        client.close()


@pytest.mark.redis
def test_redis_down_is_store_unavailable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    store = open_activity(REDIS_SETTINGS, redis_client=client)
    calls: list[Callable[[], object]] = [
        lambda: store.record([make_event()]),
        lambda: store.history("u1"),
        lambda: store.histories(["u1"]),
        lambda: store.video_stats(["v1"]),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
    client.close()
