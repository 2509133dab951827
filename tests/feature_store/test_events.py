"""The event contract: every refusal names its field, every limit holds."""

from __future__ import annotations

import json

import pytest

from feature_store.errors import InvalidInput
from feature_store.events import Event, EventType, EventValidator, encode_event
from feature_store.settings import EventLimits

NOW = 1_763_700_000_000


def valid(**overrides: object) -> dict[str, object]:
    event: dict[str, object] = {
        "event_id": "e-1",
        "user_id": "u1",
        "video_id": "v1",
        "type": "play",
        "ts": NOW - 1000,
        "watch_ms": 30_000,
        "duration_ms": 60_000,
        "context": {"device": "phone", "surface": "home", "position": 3},
    }
    event.update(overrides)
    return event


@pytest.fixture()
def validator() -> EventValidator:
    return EventValidator(EventLimits())


def refused_field(validator: EventValidator, data: object) -> str:
    with pytest.raises(InvalidInput) as info:
        validator.parse_obj(data, now_ms=NOW)
    return info.value.field


def test_valid_event_round_trips_through_the_wire_format(validator: EventValidator) -> None:
    event = validator.parse_obj(valid(), now_ms=NOW)
    assert event.type is EventType.PLAY
    assert event.watch_ratio() == 0.5
    again = validator.parse_json(encode_event(event), now_ms=NOW)
    assert again == event


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"type": "teleport"}, "type"),
        ({"user_id": ""}, "user_id"),
        ({"user_id": "x" * 129}, "user_id"),
        ({"video_id": "has space"}, "video_id"),
        ({"event_id": "semi;colon"}, "event_id"),
        ({"watch_ms": -1}, "watch_ms"),
        ({"watch_ms": 25 * 3600 * 1000}, "watch_ms"),
        ({"duration_ms": 0}, "duration_ms"),
        ({"ts": NOW + 10 * 60 * 1000}, "ts"),
        ({"ts": 1000}, "ts"),
        ({"ts": "yesterday"}, "ts"),
        ({"colour": "red"}, "colour"),
        ({"context": {"device": "phone", "mood": "happy"}}, "context.mood"),
        ({"context": {"position": -3}}, "context.position"),
        ({"recommendation_id": "r 1"}, "recommendation_id"),
        # the three ids are checked in one regex; a refusal still names the first bad one
        ({"event_id": "e-1\n"}, "event_id"),
        ({"video_id": "v1\n"}, "video_id"),
        ({"user_id": "u 1", "video_id": ""}, "user_id"),
        ({"event_id": "x" * 129, "video_id": "bad id"}, "event_id"),
        ({"user_id": "u1 v1", "video_id": "v1"}, "user_id"),
    ],
)
def test_refusals_name_the_field(
    validator: EventValidator, overrides: dict[str, object], field: str
) -> None:
    assert refused_field(validator, valid(**overrides)) == field


def test_missing_required_field_is_named(validator: EventValidator) -> None:
    data = valid()
    del data["user_id"]
    assert refused_field(validator, data) == "user_id"


def test_unknown_type_lists_the_allowed_ones(validator: EventValidator) -> None:
    with pytest.raises(InvalidInput) as info:
        validator.parse_obj(valid(type="teleport"), now_ms=NOW)
    assert "teleport" in info.value.reason and "impression" in info.value.reason


def test_malformed_json_is_refused_not_crashed(validator: EventValidator) -> None:
    with pytest.raises(InvalidInput):
        validator.parse_json(b"{not json", now_ms=NOW)
    with pytest.raises(InvalidInput) as info:
        validator.parse_obj(["a", "list"], now_ms=NOW)
    assert info.value.field == "body"


def test_limits_are_configurable(validator: EventValidator) -> None:
    strict = EventValidator(EventLimits(max_id_length=8, future_tolerance_ms=0))
    with pytest.raises(InvalidInput) as info:
        strict.parse_obj(valid(user_id="u123456789"), now_ms=NOW)
    assert info.value.field == "user_id"
    with pytest.raises(InvalidInput):
        strict.parse_obj(valid(ts=NOW + 1), now_ms=NOW)
    assert validator.parse_obj(valid(ts=NOW + 1), now_ms=NOW).ts == NOW + 1


def test_every_event_type_is_accepted(validator: EventValidator) -> None:
    for kind in EventType:
        assert validator.parse_obj(valid(type=kind.value), now_ms=NOW).type is kind


def test_wire_format_leaves_out_defaults() -> None:
    event = Event(event_id="e", user_id="u", video_id="v", type=EventType.IMPRESSION, ts=NOW)
    assert json.loads(encode_event(event)) == {
        "event_id": "e", "user_id": "u", "video_id": "v", "type": "impression", "ts": NOW,
    }
