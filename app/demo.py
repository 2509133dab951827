"""``vidrec up --demo``: a synthetic catalog and simulated users, so recommendations move.

Seeds the catalog from :class:`~feature_store.synthetic.SyntheticWorld` (only
when it is empty, so a restart keeps the same world), then runs a thread of
simulated sessions: a user (drawn by activity) asks the service for a feed
page, reacts to it according to their hidden tastes, and the events go to
the event log like a site backend's would. The trainer learns from them, the
signal feed updates trending and co-visitation, and the next pages change.

Every ``report_every_s`` the log shows the play rate of recommended videos
over the last window: it rises as the model learns the tastes.
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
from feature_store.synthetic import SyntheticWorld, WorldConfig
from feature_store.worker import Worker

if TYPE_CHECKING:
    from app.service import Service

log = logging.getLogger(__name__)

DEMO_CONFIG = WorldConfig(users=500, videos=3_000, creators=150, categories=16, seed=7)
PAGE_SIZE = 8


class DemoTraffic:
    """Simulated sessions against a running :class:`~app.service.Service`."""

    def __init__(
        self,
        service: Service,
        sessions_per_s: float = 5.0,
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
        self.shown = 0
        self.played = 0
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
        self.shown += len(shown)
        self.played += sum(1 for e in events if e.type == EventType.PLAY)
        return events

    def _loop(self, stop: threading.Event) -> None:
        last_report = time.monotonic()
        while not stop.wait(self.interval_s):
            try:
                self.session()
            except Exception as exc:  # the demo must never take the service down
                log.warning("demo session failed: %s", exc)
            if time.monotonic() - last_report >= self.report_every_s:
                model = self.service.model
                log.info(
                    "demo: %d sessions, play rate of recommended videos %.3f (model %s)",
                    self.sessions,
                    self.played / max(1, self.shown),
                    model.version if model else None,
                )
                self.shown = self.played = 0
                last_report = time.monotonic()

    def start(self) -> None:
        added = self.seed_catalog()
        if added:
            log.info("demo: seeded the catalog with %d synthetic videos", added)
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()


@contextmanager
def demo_traffic(service: Service) -> Iterator[DemoTraffic]:
    """Run :class:`DemoTraffic` for the app's lifetime."""
    demo = DemoTraffic(service)
    demo.start()
    try:
        yield demo
    finally:
        demo.close()
