"""The synthetic world: deterministic, time-ordered, and with a learnable signal."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np

from feature_store.events import EventType
from feature_store.sim.world import SyntheticWorld, WorldConfig

SMALL = WorldConfig(users=200, videos=500, creators=40, seed=7)


def test_same_seed_same_world_and_stream() -> None:
    a, b = SyntheticWorld(SMALL), SyntheticWorld(SMALL)
    assert a.videos()[:20] == b.videos()[:20]
    assert a.events(2_000) == b.events(2_000)
    assert SyntheticWorld(WorldConfig(seed=8, users=200, videos=500)).events(50) != a.events(50)


def test_stream_is_in_event_time_order_with_unique_ids() -> None:
    events = SyntheticWorld(SMALL).events(5_000)
    assert len(events) == 5_000
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert len({e.event_id for e in events}) == len(events)
    kinds = Counter(e.type for e in events)
    assert kinds[EventType.IMPRESSION] > kinds[EventType.PLAY] > kinds[EventType.LIKE] > 0


def test_popularity_is_heavy_tailed() -> None:
    events = SyntheticWorld(SMALL).events(20_000)
    shown = Counter(e.video_id for e in events if e.type == EventType.IMPRESSION)
    counts = sorted(shown.values(), reverse=True)
    assert sum(counts[:25]) > 0.2 * sum(counts)  # top 5% of videos: over a fifth of impressions


def test_plays_follow_the_latent_match() -> None:
    world = SyntheticWorld(SMALL)
    events = world.events(30_000)
    shown = [(world.video_index(e.video_id), int(e.user_id[1:])) for e in events
             if e.type == EventType.IMPRESSION]
    played = {(e.user_id, e.video_id) for e in events if e.type == EventType.PLAY}
    matches = np.array([world.match(u, v) for v, u in shown])
    was_played = np.array([(f"u{u}", f"v{v}") in played for v, u in shown])
    assert matches[was_played].mean() > matches[~was_played].mean() + 0.5


def test_catalog_is_valid_and_torch_free() -> None:
    videos = SyntheticWorld(SMALL).videos()
    assert len(videos) == 500 and all(v.duration_ms >= 8_000 for v in videos)
    # The serving process imports this module for --demo; it must not pull in torch.
    code = "import sys, feature_store.sim.world; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
