"""The served log's record: wire format round trip, and bad records dead-lettered by field."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from feature_store.errors import InvalidInput
from feature_store.eventlog.memory import MemoryEventLog
from feature_store.eventlog.streams import stream_spec
from feature_store.events import EventContext
from feature_store.served import (
    ServedArm,
    ServedItem,
    ServedRecord,
    decode_served,
    encode_served,
)
from feature_store.settings import Settings


def record(k: int = 3) -> ServedRecord:
    return ServedRecord(
        recommendation_id="r1",
        user_id="u1",
        ts_ms=1_763_700_000_000,
        model_version="main-1",
        schema_hash="abc123",
        context=EventContext(device="tv"),
        items=tuple(ServedItem(f"v{i}", i, 1.0 - i / 10, "covisit") for i in range(k)),
        request_values=np.arange(4, dtype=np.uint64) + np.uint64(2**63),
        item_values=np.arange(k * 5, dtype=np.uint64).reshape(k, 5),
    )


def test_round_trip_keeps_everything() -> None:
    original = record()
    back = decode_served(encode_served(original), 128)
    assert back.items == original.items and back.context == original.context
    assert (back.recommendation_id, back.user_id, back.ts_ms, back.model_version) == (
        "r1", "u1", original.ts_ms, "main-1")
    np.testing.assert_array_equal(back.request_values, original.request_values)
    np.testing.assert_array_equal(back.item_values, original.item_values)
    assert back.position_of("v2") == 2 and back.position_of("nope") is None


def test_version_2_carries_the_arm_and_version_1_records_still_decode() -> None:
    plain = json.loads(encode_served(record()))
    assert plain["v"] == 1 and "arm" not in plain  # no arm: still written as version 1
    assert decode_served(json.dumps(plain).encode(), 128).arm is None
    armed = dataclasses.replace(record(), arm=ServedArm("e1", "b"))
    data = json.loads(encode_served(armed))
    assert (data["v"], data["experiment"], data["arm"]) == (2, "e1", "b")
    back = decode_served(encode_served(armed), 128)
    assert back.arm == ServedArm("e1", "b") and back.items == armed.items
    for change, field in (({"arm": None}, "arm"), ({"experiment": "a b"}, "experiment")):
        with pytest.raises(InvalidInput) as raised:
            decode_served(json.dumps({**data, **change}).encode(), 128)
        assert raised.value.field == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"v": 9}, "v"),
        ({"user_id": "bad id"}, "user_id"),
        ({"recommendation_id": 7}, "recommendation_id"),
        ({"ts": -1}, "ts"),
        ({"context": {"device": 3}}, "context"),
        ({"videos": ["v0", "v1"]}, "videos"),
        ({"scores": ["x", 1, 2]}, "positions.0"),
        ({"widths": [4]}, "widths"),
        ({"request": "%%%"}, "request"),
        ({"values": "AAAA"}, "values"),
    ],
)
def test_a_bad_record_names_its_field(change: dict[str, object], field: str) -> None:
    data = json.loads(encode_served(record()))
    data.update(change)
    with pytest.raises(InvalidInput) as raised:
        decode_served(json.dumps(data).encode(), 128)
    assert raised.value.field == field


def test_bad_records_are_dead_lettered_and_the_good_ones_read() -> None:
    settings = Settings()
    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        log.produce_raw(b"u1", b"not json")
        log.produce([record()])
        reader = log.reader()
        got = reader.poll(10, 0.0)
        reader.close()
        assert [r.event.recommendation_id for r in got] == ["r1"]
        (letter,) = log.dead_letters()
        assert letter.reason.startswith("body:") and ".served." in letter.source
