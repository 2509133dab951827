"""Opening the candidate signals a process was configured for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis

from feature_store.settings import Settings
from feature_store.signals.base import CandidateSignals, SignalParams
from feature_store.signals.memory import MemorySignals
from feature_store.signals.redis import RedisSignals

if TYPE_CHECKING:
    from feature_store.runtime.resources import Resources

def signal_params(settings: Settings) -> SignalParams:
    api = settings.api
    return SignalParams(
        half_life_s=api.trending_half_life_s,
        window=api.covisit_window,
        neighbors=api.covisit_neighbors,
        decay=api.covisit_decay,
        creator_videos=api.creator_videos,
        category_videos=api.category_videos,
    )


def open_signals(
    settings: Settings, redis_client: redis.Redis | None = None
) -> MemorySignals | RedisSignals:
    """Redis when the stores are in Redis (and a client is given), else in-process."""
    if settings.stores.backend == "redis" and redis_client is not None:
        return RedisSignals(redis_client, signal_params(settings))
    return MemorySignals(signal_params(settings))


@contextmanager
def serving_signals(resources: Resources) -> Iterator[CandidateSignals]:
    """The service's signals over ``resources``, closed on exit: the service owns them.

    The memory backend restores ``data_dir/signals`` now and snapshots there
    when closed, so a restart keeps trending and co-visitation (after a kill
    -9, the signal feed replays the events since its last snapshot:
    ``app.signal_feed``). Its per-creator uploads are then indexed again from
    the catalog, which journals every write, so a video added or hidden after
    that snapshot counts as such. Open once per process (``app.service``): two
    memory copies would each snapshot over the other.
    """
    signals = open_signals(resources.settings, resources.redis_client)
    if isinstance(signals, MemorySignals):
        directory = resources.data_dir / "signals"
        signals.restore(directory)
        signals.index_videos(list(resources.catalog.iter_all()))
        signals.snapshot_dir = directory
    try:
        yield signals
    finally:
        signals.close()
