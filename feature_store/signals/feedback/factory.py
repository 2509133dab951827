"""Opening the per-user feedback a process was configured for (beside the signals)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis

from feature_store.settings import Settings
from feature_store.signals.feedback.base import FeedbackParams, UserFeedback
from feature_store.signals.feedback.memory import MemoryFeedback
from feature_store.signals.feedback.redis import RedisFeedback

if TYPE_CHECKING:
    from feature_store.runtime.resources import Resources

def feedback_params(settings: Settings) -> FeedbackParams:
    r = settings.rerank
    return FeedbackParams(
        served_window_ms=int(r.served_window_s * 1000),
        served_max=r.served_max_per_user,
        dislikes_max=r.dislikes_max_per_user,
        dislikes_ttl_ms=int(r.dislikes_ttl_s * 1000),
        positive_watch_ratio=settings.features.positive_watch_ratio,
    )


def open_feedback(
    settings: Settings, redis_client: redis.Redis | None = None
) -> MemoryFeedback | RedisFeedback:
    """Redis when the stores are in Redis (and a client is given), else in-process."""
    if settings.stores.backend == "redis" and redis_client is not None:
        return RedisFeedback(redis_client, feedback_params(settings))
    return MemoryFeedback(feedback_params(settings))


@contextmanager
def serving_feedback(resources: Resources) -> Iterator[UserFeedback]:
    """The service's feedback over ``resources``, closed on exit: the service owns it.

    The memory backend restores ``data_dir/feedback`` now and snapshots there
    when closed (and whenever the signal feed snapshots the signals). Open
    once per process (``app.service``), like the signals.
    """
    feedback = open_feedback(resources.settings, resources.redis_client)
    if isinstance(feedback, MemoryFeedback):
        directory = resources.data_dir / "feedback"
        feedback.restore(directory)
        feedback.snapshot_dir = directory
    try:
        yield feedback
    finally:
        feedback.close()
