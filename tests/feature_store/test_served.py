"""The served log's record: wire formats round trip, and bad records dead-lettered by field."""

from __future__ import annotations

import base64
import dataclasses
import gc
import json
from typing import Any

import numpy as np
import pytest

from feature_store.errors import InvalidInput
from feature_store.eventlog.memory import MemoryEventLog
from feature_store.eventlog.streams import stream_spec
from feature_store.events import EventContext
from feature_store.served import (
    FORMAT_VERSION,
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


def json_record(record: ServedRecord) -> dict[str, Any]:
    """``record`` as services before format version 3 wrote it (versions 1 and 2)."""

    def text(values: np.ndarray) -> str:
        return base64.b64encode(np.ascontiguousarray(values, dtype="<u8").tobytes()).decode()

    data: dict[str, Any] = {
        "v": 1 if record.arm is None else 2,
        "recommendation_id": record.recommendation_id,
        "user_id": record.user_id,
        "ts": record.ts_ms,
        "schema": record.schema_hash,
        "context": record.context.model_dump(exclude_none=True),
        "videos": [i.video_id for i in record.items],
        "positions": [i.position for i in record.items],
        "scores": [i.score for i in record.items],
        "sources": [i.source for i in record.items],
        "widths": [len(record.request_values), record.item_values.shape[1]],
        "request": text(record.request_values),
        "values": text(record.item_values),
    }
    if record.model_version is not None:
        data["model_version"] = record.model_version
    if record.arm is not None:
        data["experiment"], data["arm"] = record.arm
    return data


def assert_same(back: ServedRecord, original: ServedRecord) -> None:
    assert back.items == original.items and back.context == original.context
    assert (back.recommendation_id, back.user_id, back.ts_ms, back.model_version,
            back.schema_hash, back.arm) == (
        original.recommendation_id, original.user_id, original.ts_ms, original.model_version,
        original.schema_hash, original.arm)
    np.testing.assert_array_equal(back.request_values, original.request_values)
    np.testing.assert_array_equal(back.item_values, original.item_values)
    assert back.item_values.shape == original.item_values.shape
    assert back.request_values.dtype == back.item_values.dtype == np.uint64


@pytest.mark.parametrize(
    "original",
    [
        record(),
        dataclasses.replace(record(), arm=ServedArm("e1", "b")),
        dataclasses.replace(record(), model_version=None, context=EventContext()),
        record(0),
        dataclasses.replace(  # every context field, a long id, the widest uint64
            record(1),
            context=EventContext(device="phone", os="ios", country="FR", surface="home",
                                 position=3, age_group="25-34", gender="f", occupation="x"),
            user_id="u" * 128,
            request_values=np.full(4, 2**64 - 1, dtype=np.uint64),
        ),
    ],
    ids=["plain", "arm", "no-model-no-context", "no-items", "full"],
)
def test_round_trip_keeps_everything(original: ServedRecord) -> None:
    value = encode_served(original)
    assert value[0] == FORMAT_VERSION == 3  # binary: the first byte tells the format
    assert_same(decode_served(value, 128), original)
    assert original.position_of("v0") in (0, None) and original.position_of("nope") is None


def test_a_records_items_are_columns_the_collector_does_not_walk() -> None:
    """The in-process log keeps its newest records as objects: one response is a handful of
    objects for the collector, not one per item (full collections stalled the server)."""
    decoded = decode_served(encode_served(record(20)), 128)
    gc.collect()
    items = decoded.items
    assert not any(gc.is_tracked(column) for column in (
        items.video_ids, items.sources, items.positions, items.scores))
    assert items[3] == ServedItem("v3", 3, 1.0 - 3 / 10, "covisit")
    assert list(items[18:]) == [items[18], items[19]] and len(items) == 20


def test_a_served_log_read_elsewhere_keeps_nothing_for_the_collector() -> None:
    """A serving process's in-process served log that no consumer there reads (the
    trainer is another process) holds its records as bytes: no tracked object per
    response for every full collection to walk; once read here, the newest are kept."""
    settings = Settings()
    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        gc.collect()
        before = len(gc.get_objects())
        log.produce([dataclasses.replace(record(), recommendation_id=f"r{i}") for i in range(500)])
        gc.collect()
        assert len(gc.get_objects()) - before < 50
        reader = log.reader()
        assert len(reader.poll(500, 0.0)) == 500
        log.produce([record()])
        reader.close()
        assert sum(d is not None for p in log._partitions for d in p.decoded) == 1


def test_the_binary_record_is_smaller_than_the_json_one() -> None:
    big = record(20)
    assert len(encode_served(big)) < 0.9 * len(json.dumps(json_record(big)))


def test_previous_json_records_still_decode() -> None:
    """A rolling upgrade: the topic still holds what services not yet upgraded wrote."""
    for original in (record(), dataclasses.replace(record(), arm=ServedArm("e1", "b"))):
        assert_same(decode_served(json.dumps(json_record(original)).encode(), 128), original)
    data = json_record(dataclasses.replace(record(), arm=ServedArm("e1", "b")))
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
def test_a_bad_json_record_names_its_field(change: dict[str, object], field: str) -> None:
    data = json_record(record())
    data.update(change)
    with pytest.raises(InvalidInput) as raised:
        decode_served(json.dumps(data).encode(), 128)
    assert raised.value.field == field


def test_every_truncation_of_a_binary_record_is_refused_with_a_reason() -> None:
    value = encode_served(dataclasses.replace(record(), arm=ServedArm("e1", "b")))
    for cut in range(1, len(value)):
        with pytest.raises(InvalidInput) as raised:
            decode_served(value[:cut], 128)
        assert raised.value.field and str(raised.value)
    with pytest.raises(InvalidInput, match="past the record's end"):
        decode_served(value + b"\0", 128)


def _with_string(value: bytes, old: bytes, new: bytes) -> bytes:
    """``value`` with its length-prefixed string ``old`` replaced by ``new``."""
    at = value.index(len(old).to_bytes(2, "little") + old)
    return value[:at] + len(new).to_bytes(2, "little") + new + value[at + 2 + len(old):]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda v: b"\x09" + v[1:], "v"),
        (lambda v: b"x" + v[1:], "v"),
        (lambda v: b"", "v"),
        (lambda v: v[:1] + b"\xf0" + v[2:], "flags"),
        (lambda v: v[:2] + (20_000).to_bytes(2, "little") + v[4:], "videos"),
        (lambda v: v[:8] + (-1).to_bytes(8, "little", signed=True) + v[16:], "ts"),
        (lambda v: _with_string(v, b"u1", b"bad id"), "user_id"),
        (lambda v: _with_string(v, b"u1", b"\xff\xfe"), "user_id"),
        (lambda v: _with_string(v, b'{"device":"tv"}', b'{"device":3}'), "context"),
        (lambda v: _with_string(v, b'{"device":"tv"}', b"[1"), "context"),
        (lambda v: _with_string(v, b"v0 v1 v2", b"v0 v1"), "videos"),
        (lambda v: _with_string(v, b"v0 v1 v2", b"v0 v!1 v2"), "videos.1"),
        (lambda v: _with_string(v, b"covisit covisit covisit", b"covisit  covisit"), "sources"),
    ],
)
def test_a_bad_binary_record_names_its_field(edit: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        decode_served(edit(encode_served(record())), 128)
    assert raised.value.field == field


def test_garbage_is_refused_never_crashes() -> None:
    rng = np.random.default_rng(0)
    good = encode_served(record())
    for _ in range(300):
        noisy = bytearray(good)
        for at in rng.integers(0, len(good), size=int(rng.integers(1, 8))):
            noisy[at] = int(rng.integers(0, 256))
        try:
            decode_served(bytes(noisy), 128)  # a flipped score or value slot still decodes
        except InvalidInput:
            pass
        random = bytes([3]) + rng.bytes(int(rng.integers(0, 400)))
        with pytest.raises(InvalidInput):
            decode_served(random, 128)


def test_the_encoder_refuses_what_would_not_read_back() -> None:
    spaced = dataclasses.replace(record(), items=(ServedItem("v0", 0, 0.5, "two words"),),
                                 item_values=np.zeros((1, 5), np.uint64))
    with pytest.raises(ValueError, match="no space"):
        encode_served(spaced)
    with pytest.raises(ValueError, match="for 3 items"):
        encode_served(dataclasses.replace(record(), item_values=np.zeros((2, 5), np.uint64)))


def test_bad_records_are_dead_lettered_and_the_good_ones_read() -> None:
    settings = Settings()
    old = dataclasses.replace(record(), recommendation_id="r0")
    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        log.produce_raw(b"u1", b"not json")
        log.produce_raw(b"u1", encode_served(record())[:30])  # truncated
        log.produce_raw(b"u1", json.dumps(json_record(old)).encode())  # an older service's
        log.produce([record()])
        reader = log.reader()
        got = reader.poll(10, 0.0)
        reader.close()
        assert [r.event.recommendation_id for r in got] == ["r0", "r1"]
        letters = log.dead_letters()
        assert [letter.reason.split(":")[0] for letter in letters] == ["v", "scores"]
        assert "truncated record" in letters[1].reason
        assert all(".served." in letter.source for letter in letters)
