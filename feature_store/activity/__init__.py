"""Per-user histories and per-video counters. Backends ``memory`` and ``redis``."""

from feature_store.activity.base import ActivityStore, HistoryEntry, VideoStats
from feature_store.activity.factory import open_activity
from feature_store.activity.memory import MemoryActivity
from feature_store.activity.redis import RedisActivity

__all__ = [
    "ActivityStore",
    "HistoryEntry",
    "MemoryActivity",
    "RedisActivity",
    "VideoStats",
    "open_activity",
]
