"""The catalog store: the same tests against the memory and the Redis backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_store.catalog import (
    CatalogStore,
    MemoryCatalog,
    RedisCatalog,
    Video,
    open_catalog,
    validate_video,
)
from feature_store.errors import ConfigurationError, InvalidInput, NotFound, StoreUnavailable
from feature_store.settings import EventLimits, Settings
from tests.factories import make_video
from tests.services import free_port

REDIS_SETTINGS = Settings(stores={"backend": "redis"})  # type: ignore[arg-type]
BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]

OpenCatalog = Callable[[str], CatalogStore]


@pytest.fixture()
def open_store(request: pytest.FixtureRequest) -> Iterator[OpenCatalog]:
    """Opens stores of a named backend (Redis ones share the test's fresh server)."""
    clients: list[redis.Redis] = []
    stores: list[CatalogStore] = []

    def _open(backend: str, batch_chunk: int = 8192) -> CatalogStore:
        client = None
        if backend == "redis":
            client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
            clients.append(client)
        settings = Settings(
            stores={"backend": backend},  # type: ignore[arg-type]
            redis={"batch_chunk": batch_chunk},  # type: ignore[arg-type]
        )
        store = open_catalog(settings, redis_client=client)
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()
    for client in clients:
        client.close()


@pytest.fixture(params=BACKENDS)
def catalog(request: pytest.FixtureRequest, open_store: OpenCatalog) -> CatalogStore:
    return open_store(request.param)


def ids(videos: list[Video]) -> list[str]:
    return [video.video_id for video in videos]


def test_get_many_keeps_order_and_answers_none_for_unknown(catalog: CatalogStore) -> None:
    a, b = make_video(), make_video(tags=("x", "y"))
    catalog.upsert([a, b])

    assert catalog.get(a.video_id) == a
    assert catalog.get("nope") is None
    assert catalog.get_many([b.video_id, "nope", a.video_id]) == [b, None, a]
    assert catalog.get_many([]) == []
    assert catalog.count() == 2


def test_upsert_replaces_the_whole_record(catalog: CatalogStore) -> None:
    old = make_video(tags=("a", "b"), uploaded_at=1_000)
    newer = make_video(uploaded_at=2_000)
    catalog.upsert([old, newer])

    replaced = make_video(video_id=old.video_id, tags=(), uploaded_at=3_000)
    catalog.upsert([replaced])

    assert catalog.get(old.video_id) == replaced
    assert ids(catalog.recent(10)) == [old.video_id, newer.video_id]
    assert catalog.count() == 2


def test_recent_is_newest_first_within_limit_and_since(catalog: CatalogStore) -> None:
    videos = [make_video(video_id=f"v{t}", uploaded_at=t) for t in (5_000, 1_000, 3_000, 4_000)]
    tie = make_video(video_id="v3000b", uploaded_at=3_000)
    catalog.upsert([*videos, tie])

    assert ids(catalog.recent(10)) == ["v5000", "v4000", "v3000b", "v3000", "v1000"]
    assert ids(catalog.recent(2)) == ["v5000", "v4000"]
    assert ids(catalog.recent(10, since_ms=3_000)) == ["v5000", "v4000", "v3000b", "v3000"]
    assert ids(catalog.recent(2, since_ms=3_000)) == ["v5000", "v4000"]
    assert catalog.recent(10, since_ms=6_000) == []
    assert catalog.recent(0) == []


def test_hidden_videos_leave_recent_but_stay_readable(catalog: CatalogStore) -> None:
    a, b = make_video(uploaded_at=1_000), make_video(uploaded_at=2_000)
    born_hidden = make_video(uploaded_at=3_000, hidden=True)
    catalog.upsert([a, b, born_hidden])
    assert ids(catalog.recent(10)) == [b.video_id, a.video_id]

    hidden = catalog.set_hidden(b.video_id, True)

    assert hidden.hidden and hidden.video_id == b.video_id
    assert catalog.get(b.video_id) == hidden
    assert ids(catalog.recent(10)) == [a.video_id]
    assert catalog.count() == 3
    assert sorted(ids(list(catalog.iter_all()))) == sorted(
        [a.video_id, b.video_id, born_hidden.video_id]
    )

    assert catalog.set_hidden(b.video_id, False) == b
    assert catalog.set_hidden(born_hidden.video_id, False).hidden is False
    assert ids(catalog.recent(10)) == [born_hidden.video_id, b.video_id, a.video_id]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_larger_than_one_redis_chunk(
    backend: str, open_store: OpenCatalog, tmp_path: Path
) -> None:
    """A request over ``redis.batch_chunk`` keys spans several commands, all answered."""
    store = open_store(backend, batch_chunk=64)
    videos = [make_video(hidden=i % 3 == 0) for i in range(150)]
    store.upsert(videos)
    wanted = [v.video_id for v in videos] + ["nope"]

    assert store.get_many(wanted) == [*videos, None]
    assert store.count() == 150
    assert sorted(ids(list(store.iter_all()))) == sorted(wanted[:-1])
    store.snapshot(tmp_path)
    assert store.restore(tmp_path) == 150
    assert ids(store.recent(200)) == [v.video_id for v in reversed(videos) if not v.hidden]


def test_hiding_an_unknown_video_is_not_found(catalog: CatalogStore) -> None:
    with pytest.raises(NotFound, match="nope"):
        catalog.set_hidden("nope", True)


@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("target", BACKENDS)
def test_snapshot_restores_into_any_backend(
    source: str, target: str, open_store: OpenCatalog, tmp_path: Path
) -> None:
    """Round trip, and seeding Redis from an embedded snapshot (or the reverse)."""
    videos = [make_video(), make_video(hidden=True), make_video(tags=())]
    src = open_store(source)
    src.upsert(videos)
    src.snapshot(tmp_path)
    # The restore must make the target equal to the snapshot, whatever it held.
    dst = src if target == source else open_store(target)
    dst.upsert([make_video(video_id="leftover")])
    if dst is src:
        dst.set_hidden(videos[0].video_id, True)

    assert dst.restore(tmp_path) == 3

    assert dst.count() == 3
    assert dst.get("leftover") is None
    assert dst.get_many([v.video_id for v in videos]) == videos
    assert ids(dst.recent(10)) == [videos[2].video_id, videos[0].video_id]


def test_snapshot_replaces_the_old_one_atomically(catalog: CatalogStore, tmp_path: Path) -> None:
    catalog.upsert([make_video(), make_video()])
    catalog.snapshot(tmp_path)
    catalog.upsert([make_video()])
    catalog.snapshot(tmp_path)

    assert [p.name for p in tmp_path.iterdir()] == ["catalog.jsonl"]  # no temp file left
    assert catalog.restore(tmp_path) == 3


def test_restore_without_a_snapshot_is_not_found(catalog: CatalogStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        catalog.restore(tmp_path)


@pytest.mark.redis
def test_the_factory_opens_the_configured_backend(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert isinstance(open_catalog(Settings()), MemoryCatalog)
        assert isinstance(open_catalog(REDIS_SETTINGS, redis_client=client), RedisCatalog)
        with pytest.raises(ConfigurationError, match="stores.backend"):
            open_catalog(REDIS_SETTINGS)
    finally:
        client.close()


@pytest.mark.redis
def test_redis_down_is_store_unavailable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    store = open_catalog(REDIS_SETTINGS, redis_client=client)
    calls: list[Callable[[], object]] = [
        lambda: store.get("v1"),
        lambda: store.get_many(["v1", "v2"]),
        lambda: store.upsert([make_video()]),
        lambda: store.set_hidden("v1", True),
        lambda: store.recent(10),
        lambda: store.count(),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
    client.close()


VALID = {
    "video_id": "v1",
    "creator_id": "c1",
    "category": "music",
    "tags": ["live"],
    "duration_ms": 60_000,
    "uploaded_at": 1_700_000_000_000,
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"video_id": "has space"}, "video_id"),
        ({"creator_id": "ü"}, "creator_id"),
        ({"tags": ["t"] * 33}, "tags"),
        ({"tags": ["ok", "b@d tag"]}, "tags.1"),
        ({"duration_ms": -5}, "duration_ms"),
        ({"duration_ms": 25 * 3600 * 1000}, "duration_ms"),
        ({"uploaded_at": -1}, "uploaded_at"),
    ],
)
def test_validate_video_names_the_bad_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_video({**VALID, **change}, EventLimits())
    assert caught.value.field == field


def test_validate_video_accepts_a_valid_record() -> None:
    assert validate_video(VALID, EventLimits()).tags == ("live",)
