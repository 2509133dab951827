"""The video catalog: what can be recommended. Backends ``memory`` and ``redis``."""

from feature_store.catalog.base import CatalogStore, Video, validate_video
from feature_store.catalog.factory import open_catalog
from feature_store.catalog.memory import MemoryCatalog
from feature_store.catalog.redis import RedisCatalog

__all__ = [
    "CatalogStore",
    "MemoryCatalog",
    "RedisCatalog",
    "Video",
    "open_catalog",
    "validate_video",
]
