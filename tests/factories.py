"""Test data with sensible valid defaults: override only what a test is about.

Every call gets a fresh ``event_id`` / ``video_id`` and a later ``ts`` /
``uploaded_at`` than the call before, so unrelated records never collide and
records made in order are also ordered in time. Values go through the
pydantic models, so an override that breaks the contract fails here loudly.
"""

from __future__ import annotations

import itertools
from typing import Any

from feature_store.catalog.base import Video
from feature_store.events import Event

BASE_TS = 1_700_000_000_000
"""2023-11-14, ms since epoch: recent enough for every limit, fixed for repeatability."""

_sequence = itertools.count(1)


def make_event(**overrides: Any) -> Event:
    """A valid event: user ``u1`` played 30 s of the 60 s video ``v1``."""
    n = next(_sequence)
    fields: dict[str, Any] = {
        "event_id": f"e{n}",
        "user_id": "u1",
        "video_id": "v1",
        "type": "play",
        "ts": BASE_TS + n * 1000,
        "watch_ms": 30_000,
        "duration_ms": 60_000,
    }
    fields.update(overrides)
    return Event.model_validate(fields)


def make_video(**overrides: Any) -> Video:
    """A valid visible 60 s video with a fresh id, uploaded after the previous one."""
    n = next(_sequence)
    fields: dict[str, Any] = {
        "video_id": f"v{n}",
        "creator_id": "c1",
        "category": "music",
        "tags": ("live",),
        "duration_ms": 60_000,
        "uploaded_at": BASE_TS + n * 1000,
    }
    fields.update(overrides)
    return Video.model_validate(fields)
