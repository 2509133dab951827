"""Per-user feedback for reranking: served without engagement, and dislikes."""

from feature_store.signals.feedback.base import (
    EMPTY_VIEW,
    ENGAGEMENTS,
    FeedbackParams,
    FeedbackView,
    ServedBatch,
    UserFeedback,
)
from feature_store.signals.feedback.factory import (
    feedback_params,
    open_feedback,
    serving_feedback,
)
from feature_store.signals.feedback.memory import MemoryFeedback
from feature_store.signals.feedback.redis import RedisFeedback

__all__ = [
    "EMPTY_VIEW",
    "ENGAGEMENTS",
    "FeedbackParams",
    "FeedbackView",
    "MemoryFeedback",
    "RedisFeedback",
    "ServedBatch",
    "UserFeedback",
    "serving_feedback",
    "feedback_params",
    "open_feedback",
]
