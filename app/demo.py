"""``vidrec up --demo``: a synthetic catalog and simulated users, so recommendations move.

Seeds the catalog from :class:`~feature_store.sim.world.SyntheticWorld` (only
when it is empty, so a restart keeps the same world), then runs a thread of
simulated sessions: a user (drawn by activity) asks the service for a feed
page, reacts to it according to their hidden tastes, and the events go to
the event log like a site backend's would. The trainer learns from them, the
signal feed updates trending and co-visitation, and the next pages change.

Every ``report_every_s`` the log shows, over the last window, the play rate
of recommended videos and the **personalisation figure**: the share of the
recommended videos that lie in the user's own favourite categories (the
three the simulated user's hidden tastes rate highest), beside the same
share for what a popularity recommender shows that user (the current
trending videos). A feed that follows each user rises well above the
popularity share as the model learns the tastes; the dashboard shows both
(:meth:`DemoTraffic.figures`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from app.schemas import RecommendRequest
from feature_store.events import Event, EventType
from feature_store.runtime.worker import Worker
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld, WorldConfig

if TYPE_CHECKING:
    from app.service import Service

log = logging.getLogger(__name__)

DEMO_CONFIG = WorldConfig(users=300, videos=1_500, creators=100, categories=12, seed=7)
"""Small enough that the simulated users' tastes are learnt within minutes at the demo's
traffic (each video is shown a few dozen times in the first five minutes)."""
PAGE_SIZE = 8
SESSIONS_PER_S = 20.0
"""Feed pages asked for per second: about 250 events/s, a few percent of one core."""
EXPORT_EVERY_S = 20.0
"""The trainer's export interval under ``--demo`` unless ``trainer.export_every_s`` is set:
the network the service scores with learns the simulated tastes within minutes, and a
person watching sees it follow (an export of the demo's catalog takes well under 1 s)."""


def demo_settings(settings: Settings) -> Settings:
    """``settings`` for ``vidrec up --demo``: exports every :data:`EXPORT_EVERY_S` unless the
    export interval was set (``VIDREC_TRAINER__EXPORT_EVERY_S``)."""
    if "export_every_s" in settings.trainer.model_fields_set:
        return settings
    trainer = settings.trainer.model_copy(update={"export_every_s": EXPORT_EVERY_S})
    return settings.model_copy(update={"trainer": trainer})


class DemoTraffic:
    """Simulated sessions against a running :class:`~app.service.Service`."""

    def __init__(
        self,
        service: Service,
        sessions_per_s: float = SESSIONS_PER_S,
        report_every_s: float = 30.0,
        config: WorldConfig = DEMO_CONFIG,
    ) -> None:
        self.service = service
        self.world = SyntheticWorld(replace(config, start_ts=int(time.time() * 1000)))
        self.interval_s = 1.0 / sessions_per_s
        self.report_every_s = report_every_s
        self.run_id = uuid.uuid4().hex[:8]
        self.rng = np.random.default_rng()
        self.sessions = 0
        self.window = DemoWindow()
        """Figures of the current report window."""
        self.last = DemoWindow()
        """Figures of the last complete window (what the dashboard shows)."""
        self._worker = Worker("vidrec-demo", self._loop)

    def seed_catalog(self) -> int:
        """Upload the synthetic catalog if the catalog is empty; returns videos added."""
        resources = self.service.resources
        if resources.catalog.count() > 0:
            return 0
        videos = self.world.videos()
        for start in range(0, len(videos), 1000):
            chunk = videos[start : start + 1000]
            resources.catalog.upsert(chunk)
            self.service.signals.index_videos(chunk)
        return len(videos)

    def session(self) -> list[Event]:
        """One simulated feed page and the user's reactions, written to the event log."""
        world = self.world
        user = int(self.rng.choice(world.config.users, p=world.user_activity))
        context = world.context(user, "home", 0).model_copy(update={"position": None})
        page = self.service.recommender.recommend(
            RecommendRequest(user_id=world.user_id(user), count=PAGE_SIZE, context=context)
        )
        shown = [
            world.video_index(item.video_id)
            for item in page.items
            if item.video_id[1:].isdigit() and int(item.video_id[1:]) < world.config.videos
        ]
        if not shown:
            shown = world.candidates(user, PAGE_SIZE)
        now = int(time.time() * 1000)
        events = world.respond(user, shown, now)
        shift = now - max(e.ts for e in events)  # reactions happened just now, not in the future
        events = [
            e.model_copy(
                update={
                    "event_id": f"demo-{self.run_id}-{e.event_id}",
                    "ts": e.ts + shift,
                    "recommendation_id": page.recommendation_id,
                    "model_version": page.model_version,
                }
            )
            for e in events
        ]
        self.service.resources.event_log.produce(events)
        self.sessions += 1
        self.window.count(
            shown,
            sum(1 for e in events if e.type == EventType.PLAY),
            self.favourites(user),
            self.popular_categories(),
            world,
        )
        return events

    def favourites(self, user: int, top: int = 3) -> set[int]:
        """The ``top`` categories ``user``'s hidden tastes rate highest."""
        return set(np.argsort(-self.world.user_taste[user])[:top].tolist())

    def popular_categories(self) -> list[int]:
        """Categories of what a popularity recommender shows now: the trending page."""
        world = self.world
        ids = [v for v, _ in self.service.signals.trending(4 * PAGE_SIZE)]
        index = [world.video_index(v) for v in ids if v[1:].isdigit()]
        known = [i for i in index if i < world.config.videos][:PAGE_SIZE]
        return [int(world.video_category[i]) for i in known]

    def figures(self) -> dict[str, float | int | None]:
        """The last complete window's figures (the dashboard's demo tiles)."""
        return {"sessions": self.sessions, **self.last.figures()}

    def _loop(self, stop: threading.Event) -> None:
        last_report = time.monotonic()
        while not stop.wait(self.interval_s):
            try:
                self.session()
            except Exception as exc:  # the demo must never take the service down
                log.warning("demo session failed: %s", exc)
            if time.monotonic() - last_report >= self.report_every_s:
                model = self.service.model
                self.last, self.window = self.window, DemoWindow()
                f = self.last.figures()
                log.info(
                    "demo: %d sessions, play rate of recommended videos %s, in the user's "
                    "favourite categories %s (popularity %s) (model %s)",
                    self.sessions, _share(f["play_rate"]), _share(f["favourite_share"]),
                    _share(f["popular_favourite_share"]), model.version if model else None,
                )
                last_report = time.monotonic()

    def start(self) -> None:
        added = self.seed_catalog()
        if added:
            log.info("demo: seeded the catalog with %d synthetic videos", added)
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()


class DemoWindow:
    """Counts of one report window: videos shown, played, in the user's favourites."""

    def __init__(self) -> None:
        self.shown = self.played = self.favourite = 0
        self.popular_shown = self.popular_favourite = 0

    def count(
        self,
        shown: list[int],
        played: int,
        favourites: set[int],
        popular: list[int],
        world: SyntheticWorld,
    ) -> None:
        """One session: the videos ``shown`` (world indices), how many were played, the
        user's favourite categories and the categories of the popularity page."""
        self.shown += len(shown)
        self.played += played
        self.favourite += sum(int(world.video_category[v]) in favourites for v in shown)
        self.popular_shown += len(popular)
        self.popular_favourite += sum(c in favourites for c in popular)

    def figures(self) -> dict[str, float | None]:
        """Shares in [0, 1] (None before anything was shown)."""
        return {
            "play_rate": self.played / self.shown if self.shown else None,
            "favourite_share": self.favourite / self.shown if self.shown else None,
            "popular_favourite_share": (
                self.popular_favourite / self.popular_shown if self.popular_shown else None
            ),
        }


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@contextmanager
def demo_traffic(service: Service) -> Iterator[DemoTraffic]:
    """Run :class:`DemoTraffic` for the app's lifetime."""
    demo = DemoTraffic(service)
    demo.start()
    try:
        yield demo
    finally:
        demo.close()
