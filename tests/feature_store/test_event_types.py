"""The declaration of event semantics: complete, consistent, and what its readers use."""

from __future__ import annotations

import pytest

from feature_store.activity.base import POSITIVE_ACTIONS, VideoStats
from feature_store.activity.rules import ACTION_RANK, COUNTER_FIELDS
from feature_store.event_types import (
    CHOSEN_COUNTERS,
    COUNTERS,
    MEANINGS,
    EventType,
    of_types,
    valued,
)
from feature_store.signals.base import EVENT_WEIGHTS
from feature_store.signals.feedback.base import ENGAGEMENTS


def test_every_event_type_is_declared_once() -> None:
    assert set(MEANINGS) == set(EventType)
    assert all(m.type is kind for kind, m in MEANINGS.items())


def test_counters_are_video_stats_fields() -> None:
    assert set(COUNTER_FIELDS) <= set(VideoStats.model_fields)
    assert len(set(COUNTERS)) == len(COUNTERS)


def test_engaged_has_one_meaning_for_every_reader() -> None:
    """Engaged: the user started the video or acted for it; skips and dislikes respond
    without engaging, and an impression is no response."""
    engaged = {"click", "play", "progress", "finish", "like", "share"}
    assert {k.value for k in of_types("engaged")} == engaged
    assert {k.value for k in ENGAGEMENTS} == engaged
    assert {k.value for k in of_types("resolves")} == engaged | {"skip", "dislike"}


def test_chosen_events_and_their_counters() -> None:
    assert {k.value for k in of_types("chosen")} == {"play", "finish", "like", "share"}
    assert CHOSEN_COUNTERS == ("plays", "finishes", "likes", "shares")
    assert VideoStats(plays=2, finishes=1, likes=1, clicks=5).engagements == 4


def test_history_actions_follow_the_verdicts() -> None:
    assert POSITIVE_ACTIONS == {"play", "finish", "like", "share"}
    # A dislike outranks everything, a positive a skip or a short play.
    assert max(ACTION_RANK, key=ACTION_RANK.__getitem__) == "dislike"
    assert min(ACTION_RANK, key=ACTION_RANK.__getitem__) == "short"
    assert ACTION_RANK["skip"] < ACTION_RANK["play"] < ACTION_RANK["finish"]


def test_trending_weights_count_only_engagement() -> None:
    assert {k.value: w for k, w in EVENT_WEIGHTS.items()} == {
        "click": 0.5, "play": 1.0, "finish": 2.0, "like": 3.0, "share": 4.0,
    }


@pytest.mark.parametrize(
    ("kind", "ratio", "expected"),
    [
        ("finish", None, True),
        ("like", 0.0, True),
        ("skip", 1.0, False),
        ("dislike", None, False),
        ("play", 0.7, True),
        ("play", 0.05, False),
        ("play", 0.3, None),
        ("play", None, None),
        ("progress", 0.9, None),
        ("click", None, None),
        ("impression", None, None),
    ],
)
def test_valued_reads_the_verdict(kind: str, ratio: float | None, expected: bool | None) -> None:
    assert valued(EventType(kind), ratio, 0.5, 0.1) is expected
