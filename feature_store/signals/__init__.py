"""Online candidate signals (trending, co-visitation, creator uploads), shared across processes."""

from feature_store.signals.base import CandidateSignals, SignalParams
from feature_store.signals.factory import attach_signals, open_signals
from feature_store.signals.memory import MemorySignals
from feature_store.signals.redis import RedisSignals

__all__ = [
    "CandidateSignals",
    "MemorySignals",
    "RedisSignals",
    "SignalParams",
    "attach_signals",
    "open_signals",
]
