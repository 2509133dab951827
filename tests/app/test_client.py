"""The Python client (``app.client``), sync and async, against the real service.

The service runs under uvicorn on a real socket with the embedded trainer
(as ``vidrec up`` runs it), behind one test-only ASGI wrapper that can lose
an answer on its way back: the request reaches the service and is stored,
the client sees a 503 and resends. The trainer then meets each of those
events twice in the log and trains it once (its ``event_id``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.client import ApiError, AsyncClient, Client, Retry, Unreachable
from app.main import create_app
from app.wiring import embedded_trainer
from tests.app.conftest import KEY, make_settings, publish_model, serve_in_thread, wait_for
from tests.factories import make_video

pytestmark = pytest.mark.slow

WRITE_KEY = KEY["X-API-Key"]
VIDEOS = [make_video(video_id=f"c{i}", category=f"k{i % 3}") for i in range(30)]
QUICK = Retry(attempts=4, backoff_s=0.01, max_backoff_s=0.05)


class LoseAnswers:
    """Passes requests to ``app``; the next ``lose`` answers to ``POST /v1/events`` are
    replaced by a 503 after the service handled the request (the events are stored)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.lose = 0
        self.lost = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/events" or self.lose <= 0:
            await self.app(scope, receive, send)
            return
        self.lose -= 1

        async def drop(message: Message) -> None:
            return None

        await self.app(scope, receive, drop)
        self.lost += 1
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"retry-after", b"0")]})
        await send({"type": "http.response.body",
                    "body": b'{"error": "BackendUnavailable", "message": "answer lost"}'})


@dataclass
class Served:
    url: str
    app: Any
    wrapper: LoseAnswers
    version: str

    @property
    def trainer(self) -> Any:
        return self.app.state.service.trainer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    settings = make_settings(
        tmp_path_factory.mktemp("client") / "data",
        trainer={"export_every_s": 0, "max_wait_ms": 50, "batch_size": 64},
    )
    app = create_app(settings, trainer=embedded_trainer)
    wrapper = LoseAnswers(app)
    with serve_in_thread(wrapper) as url:
        service = app.state.service
        version = publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None and service.model.version == version)
        yield Served(url, app, wrapper, version)


def play(user: str, video: str, n: int) -> dict[str, Any]:
    return {"event_id": f"{user}-{video}-{n}", "user_id": user, "video_id": video,
            "type": "play", "watch_ms": 20_000, "duration_ms": 60_000}


def test_sync_client_writes_reads_and_batches(served: Served) -> None:
    with Client(served.url, api_key=WRITE_KEY, retry=QUICK, batch_size=4) as vidrec:
        written = vidrec.put_videos(VIDEOS)
        assert (written.accepted, written.rejected) == (30, 0)
        assert vidrec.get_video("c4").category == "k1"

        bad = {**play("ann", "c1", 0), "type": "teleport"}
        result = vidrec.send_events([play("ann", "c1", 1), bad, *(
            play("ann", f"c{i}", 2) for i in range(2, 8))])
        assert (result.accepted, result.rejected) == (7, 1)
        assert (result.errors[0].index, result.errors[0].field) == (1, "type")  # across batches

        page = vidrec.recommend("ann", count=5, candidates=[v.video_id for v in VIDEOS],
                                exclude_seen=False)
        assert page.model_version == served.version and len(page.items) == 5
        assert page.items[0].video_id.startswith("c")

        answers = vidrec.recommend_batch([{"user_id": "ann", "count": 3},
                                          {"user_id": "nobody", "count": 2}])
        assert [(a.user_id, len(a.items) <= n) for a, n in zip(answers, (3, 2), strict=True)] \
            == [("ann", True), ("nobody", True)]
        assert answers[1].fallback_reason == "unknown_user"

        # track: a batch goes once 4 events wait, with ids and times filled in.
        sent = [vidrec.track({"user_id": "bo", "video_id": f"c{i}", "type": "impression"})
                for i in range(6)]
        assert [s is not None for s in sent] == [False, False, False, True, False, False]
        assert sent[3] is not None and sent[3].accepted == 4
        assert len(vidrec.buffer) == 2  # sent on leaving the block

        with pytest.raises(ApiError) as refused:
            vidrec.recommend("ann", count=100_000)
        assert (refused.value.status, refused.value.field) == (422, "count")
        with pytest.raises(ApiError) as missing:
            vidrec.get_video("nope")
        assert missing.value.status == 404
    assert len(vidrec.buffer) == 0
    wait_for(lambda: served.trainer.status()["events_total"] >= 13, timeout_s=60)


def test_async_client_does_the_same(served: Served) -> None:
    async def scenario() -> tuple[Any, Any, Any]:
        async with AsyncClient(served.url, api_key=WRITE_KEY, retry=QUICK,
                               batch_size=3) as vidrec:
            written = await vidrec.send_events([play("cy", f"c{i}", 0) for i in range(5)])
            page = await vidrec.recommend("cy", count=4)
            answers = await vidrec.recommend_batch([{"user_id": "cy"}, {"user_id": "ann"}])
            for i in range(4):
                await vidrec.track({"user_id": "cy", "video_id": f"c{i}", "type": "impression"})
            assert len(vidrec.buffer) == 1
            video = await vidrec.get_video("c2")
        assert len(vidrec.buffer) == 0
        return written, (page, answers), video

    written, (page, answers), video = asyncio.run(scenario())
    assert (written.accepted, written.rejected) == (5, 0)
    assert page.model_version == served.version and len(page.items) <= 4
    assert [a.user_id for a in answers] == ["cy", "ann"]
    assert video.video_id == "c2"


def test_a_lost_answer_is_resent_with_the_same_ids_and_trained_once(served: Served) -> None:
    trainer = served.trainer
    before = trainer.status()
    events = [play("dee", f"c{i}", 9) for i in range(10)]
    events += [{"user_id": "dee", "video_id": "c20", "type": "impression"}]  # no id: given one
    served.wrapper.lose = 1
    with Client(served.url, api_key=WRITE_KEY, retry=QUICK) as vidrec:
        result = vidrec.send_events(events)
    assert served.wrapper.lost == 1 and (result.accepted, result.rejected) == (11, 0)
    # The log holds the batch twice; the trainer trains each event once (by event_id).
    after = wait_for(lambda: (s := trainer.status())["events_total"] >= before[
        "events_total"] + 22 and s, timeout_s=60)
    assert after["duplicates"] - before["duplicates"] == 11


def test_retries_give_up_with_the_services_error_and_keep_tracked_events(
    served: Served,
) -> None:
    served.wrapper.lose = 10  # more than the client's tries
    vidrec = Client(served.url, api_key=WRITE_KEY, retry=QUICK, batch_size=2)
    try:
        assert vidrec.track({"user_id": "eve", "video_id": "c1", "type": "impression"}) is None
        with pytest.raises(ApiError) as down:
            vidrec.track({"user_id": "eve", "video_id": "c2", "type": "impression"})
        assert down.value.status == 503 and down.value.retry_after_s == 0
        assert served.wrapper.lost == 1 + 4  # the earlier test's, then QUICK.attempts
        kept = list(vidrec.buffer.take())
        assert [e["video_id"] for e in kept] == ["c1", "c2"]  # nothing lost, ids kept
        vidrec.buffer.put_back(kept)
        served.wrapper.lose = 0
        assert vidrec.flush().accepted == 2
    finally:
        served.wrapper.lose = 0
        vidrec.close()
    with Client("http://127.0.0.1:9", retry=QUICK) as nowhere, pytest.raises(Unreachable):
        nowhere.recommend("ann")
