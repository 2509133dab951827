"""Online candidate signals (trending, co-visitation, creator uploads), shared across processes."""

from feature_store.signals.base import CandidateSignals, SignalParams
from feature_store.signals.factory import open_signals, serving_signals
from feature_store.signals.memory import MemorySignals
from feature_store.signals.redis import RedisSignals

__all__ = [
    "CandidateSignals",
    "MemorySignals",
    "RedisSignals",
    "SignalParams",
    "serving_signals",
    "open_signals",
]
