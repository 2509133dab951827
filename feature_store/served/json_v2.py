"""The served log's previous wire format (versions 1 and 2: JSON), still read.

Services before format version 3 wrote each record as one JSON object (base64
for the two arrays, little endian uint64), versioned by ``v``; ``v: 2``
added ``experiment`` and ``arm``. During a rolling upgrade the served topic
holds both formats: :func:`feature_store.served.decode_served` tells them
apart by the first byte (``{`` here) and hands these to
:func:`decode_served_json`. Nothing writes this format any more; once the
topic's retention (``served_log.kafka_retention_ms``, a day by default) has
passed since the last old service stopped, this module can go.

The decoder checks ids, sizes and that the arrays have the widths the record
states; whether those widths fit the reader's schema is the reader's business.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from feature_store.errors import InvalidInput
from feature_store.events import EventContext, check_id
from feature_store.served.record import (
    HARD_MAX_ITEMS,
    ServedArm,
    ServedItem,
    ServedItems,
    ServedRecord,
)

_VERSIONS = (1, 2)


def _uint64s(text: object, count: int, field: str) -> npt.NDArray[np.uint64]:
    if not isinstance(text, str):
        raise InvalidInput(field, "must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(field, "is not valid base64") from exc
    if len(raw) != 8 * count:
        raise InvalidInput(field, f"holds {len(raw)} bytes, not {8 * count}")
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def _int(data: dict[str, Any], field: str, low: int, high: int) -> int:
    value = data.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(field, f"must be an integer between {low} and {high}")
    return value


def _items(data: dict[str, Any], max_id_length: int) -> ServedItems:
    lists = [data.get(name) for name in ("videos", "positions", "scores", "sources")]
    if not all(isinstance(x, list) for x in lists):
        raise InvalidInput("videos", "videos, positions, scores and sources must be lists")
    videos, positions, scores, sources = lists
    assert isinstance(videos, list)
    if len(videos) > HARD_MAX_ITEMS or len({len(x) for x in lists if isinstance(x, list)}) > 1:
        raise InvalidInput("videos", f"at most {HARD_MAX_ITEMS} items, as many in each list")
    items = []
    for i, (video_id, position, score, source) in enumerate(
        zip(videos, positions, scores, sources, strict=True)  # type: ignore[arg-type]
    ):
        if not isinstance(video_id, str) or not isinstance(source, str):
            raise InvalidInput(f"videos.{i}", "video ids and sources must be strings")
        check_id(f"videos.{i}", video_id, max_id_length)
        if not isinstance(position, int) or not isinstance(score, int | float):
            raise InvalidInput(f"positions.{i}", "positions are integers, scores numbers")
        items.append(ServedItem(video_id, position, float(score), source))
    return ServedItems.of(items)


def _strings(data: dict[str, Any], max_id_length: int) -> dict[str, str | None]:
    """The record's ids (``model_version`` may be absent)."""
    out: dict[str, str | None] = {}
    for field in ("recommendation_id", "user_id", "schema", "model_version"):
        text = data.get(field)
        if text is None and field == "model_version":
            out[field] = None
            continue
        if not isinstance(text, str):
            raise InvalidInput(field, "must be a string")
        check_id(field, text, max_id_length)
        out[field] = text
    return out


def decode_served_json(value: bytes, max_id_length: int) -> ServedRecord:
    """The record in ``value``; :class:`InvalidInput` naming the field when it is not one."""
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("body", "not a JSON object") from exc
    if not isinstance(data, dict):
        raise InvalidInput("body", "not a JSON object")
    version = data.get("v")
    if version not in _VERSIONS or isinstance(version, bool):
        raise InvalidInput("v", f"unknown format version {version!r}")
    ids = _strings(data, max_id_length)
    arm = _arm(data, max_id_length) if version >= 2 else None
    ts = _int(data, "ts", 0, 2**53)
    try:
        context = EventContext.model_validate(data.get("context", {}))
    except ValidationError as exc:
        raise InvalidInput("context", str(exc.errors(include_url=False)[0]["msg"])) from exc
    items = _items(data, max_id_length)
    widths = data.get("widths")
    if not (isinstance(widths, list) and len(widths) == 2
            and all(isinstance(w, int) and 0 <= w <= 4096 for w in widths)):
        raise InvalidInput("widths", "must be two small integers")
    request = _uint64s(data.get("request"), widths[0], "request")
    per_item = _uint64s(data.get("values"), widths[1] * len(items), "values")
    return ServedRecord(
        recommendation_id=str(ids["recommendation_id"]),
        user_id=str(ids["user_id"]),
        ts_ms=ts,
        model_version=ids["model_version"],
        schema_hash=str(ids["schema"]),
        context=context,
        items=items,
        request_values=request,
        item_values=per_item.reshape(len(items), widths[1]),
        arm=arm,
    )


def _arm(data: dict[str, Any], max_id_length: int) -> ServedArm:
    fields = []
    for field in ("experiment", "arm"):
        text = data.get(field)
        if not isinstance(text, str):
            raise InvalidInput(field, "must be a string (format version 2)")
        check_id(field, text, max_id_length)
        fields.append(text)
    return ServedArm(*fields)
