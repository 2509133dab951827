"""The served log's wire format, version 3: a small binary record.

Why binary: the JSON of versions 1 and 2 (:mod:`feature_store.served.json_v2`)
spent most of its time turning the packed values into base64 text and back,
on the service's writer thread, where it took the GIL from the next request
(issue #24). Here the arrays are their own little-endian bytes, copied once,
and the header is one ``struct`` call. Nothing in a record is executable or
pickled: a reader only slices bytes, checks sizes and validates ids.

Layout (little endian)::

    header    16 bytes  u8 version (3), u8 flags, u16 items K, u16 request width R,
                        u16 item width I, i64 ts_ms
    scores    K  x f8   the model's score of each item, in response order
    request   R  x u8   the slots every item shares
    values  K*I  x u8   the other slots, item after item
    positions K  x u4   each item's rank in the response
    strings   u16 byte length + UTF-8, in this order: recommendation_id, user_id,
              schema hash, model version (flag 1), experiment and arm (flag 2),
              the context as compact JSON, the K video ids joined by spaces,
              the K sources joined by spaces

Ids never hold a space (:data:`feature_store.events.ID_CHARSET`), nor do the
sources' names, so the joined lists split back exactly (the encoder refuses
one that would not). The first byte is the version: a JSON record starts
with ``{`` (0x7B), so readers tell the formats apart (:func:`feature_store.served.decode_served`).

With the default schema (112 request slots, 43 item slots) a 20-item
response is 16 + 160 + 896 + 6,880 + 80 bytes of numbers plus about 470 of
strings: 8,503 bytes, where the JSON was 11,536.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from feature_store.errors import InvalidInput
from feature_store.events import EventContext, check_id
from feature_store.served.record import HARD_MAX_ITEMS, ServedArm, ServedItems, ServedRecord

VERSION = 3
"""The first byte of every binary record."""
_HEADER = struct.Struct("<BBHHHq")
_LENGTH = struct.Struct("<H")
_HAS_MODEL = 1
_HAS_ARM = 2
_MAX_WIDTH = 4096
_MAX_TS = 2**53


def encode_binary(record: ServedRecord) -> bytes:
    """``record`` in the layout of the module docstring; :class:`ValueError` if it cannot be
    written so that it reads back the same (an id with a space, a width out of range)."""
    items = record.items
    k = len(items)
    request = np.ascontiguousarray(record.request_values, dtype="<u8")
    values = np.ascontiguousarray(record.item_values, dtype="<u8")
    if values.ndim != 2 or len(values) != k:
        raise ValueError(f"item values of shape {values.shape} for {k} items")
    width = values.shape[1]
    if k > HARD_MAX_ITEMS or max(len(request), width) > _MAX_WIDTH:
        raise ValueError(f"{k} items of width {width}, request width {len(request)}: too large")
    flags = (_HAS_MODEL if record.model_version is not None else 0) | (
        _HAS_ARM if record.arm is not None else 0
    )
    strings = [record.recommendation_id, record.user_id, record.schema_hash]
    if record.model_version is not None:
        strings.append(record.model_version)
    if record.arm is not None:
        strings += record.arm
    strings.append(record.context.model_dump_json(exclude_none=True))
    for name, words in (("video ids", items.video_ids), ("sources", items.sources)):
        joined = " ".join(words)
        if joined.count(" ") != max(0, k - 1) or not all(words):
            raise ValueError(f"{name} must be non-empty and hold no space: {words!r}")
        strings.append(joined)
    parts = [
        _HEADER.pack(VERSION, flags, k, len(request), width, record.ts_ms),
        items.scores.astype("<f8").tobytes(),
        request.tobytes(),
        values.tobytes(),
        items.positions.astype("<u4").tobytes(),
    ]
    for text in strings:
        raw = text.encode()
        parts += (_LENGTH.pack(len(raw)), raw)
    return b"".join(parts)


class _Reader:
    """A cursor over one record's bytes: every read checks that the bytes are there."""

    def __init__(self, value: bytes, at: int) -> None:
        self.value = value
        self.at = at

    def _take(self, field: str, size: int) -> int:
        start = self.at
        if start + size > len(self.value):
            raise InvalidInput(
                field,
                f"truncated record: {size} bytes needed at offset {start}, "
                f"the record has {len(self.value)}",
            )
        self.at = start + size
        return start

    def array(self, field: str, dtype: str, count: int) -> npt.NDArray[Any]:
        """``count`` numbers of ``dtype`` (little endian), as a native array of their own."""
        size = np.dtype(dtype).itemsize * count
        start = self._take(field, size)
        return np.frombuffer(self.value, dtype, count, start).astype(dtype[1:])

    def text(self, field: str) -> str:
        (size,) = _LENGTH.unpack_from(self.value, self._take(field, _LENGTH.size))
        start = self._take(field, size)
        try:
            return self.value[start : start + size].decode()
        except UnicodeDecodeError as exc:
            raise InvalidInput(field, "is not UTF-8") from exc

    def an_id(self, field: str, max_id_length: int) -> str:
        text = self.text(field)
        check_id(field, text, max_id_length)
        return text


def decode_binary(value: bytes, max_id_length: int) -> ServedRecord:
    """The record in ``value`` (a binary one: see the module docstring); :class:`InvalidInput`
    naming the field when it is not one, a truncated record included."""
    if len(value) < _HEADER.size:
        raise InvalidInput("body", f"truncated record: {len(value)} bytes, the header is 16")
    version, flags, k, request_width, width, ts_ms = _HEADER.unpack_from(value)
    if version != VERSION:
        raise InvalidInput("v", f"unknown format version {version}")
    if flags & ~(_HAS_MODEL | _HAS_ARM):
        raise InvalidInput("flags", f"unknown flags {flags:#x}")
    if k > HARD_MAX_ITEMS or max(request_width, width) > _MAX_WIDTH:
        raise InvalidInput("videos", f"{k} items of width {width}: at most {HARD_MAX_ITEMS}"
                           f" items, widths at most {_MAX_WIDTH}")
    if not 0 <= ts_ms <= _MAX_TS:
        raise InvalidInput("ts", f"must be an integer between 0 and {_MAX_TS}")
    read = _Reader(value, _HEADER.size)
    scores = read.array("scores", "<f8", k)
    request = read.array("request", "<u8", request_width)
    values = read.array("values", "<u8", k * width).reshape(k, width)
    positions = read.array("positions", "<u4", k)
    recommendation_id = read.an_id("recommendation_id", max_id_length)
    user_id = read.an_id("user_id", max_id_length)
    schema_hash = read.an_id("schema", max_id_length)
    model_version = read.an_id("model_version", max_id_length) if flags & _HAS_MODEL else None
    arm = None
    if flags & _HAS_ARM:
        arm = ServedArm(read.an_id("experiment", max_id_length), read.an_id("arm", max_id_length))
    context = _context(read.text("context"))
    videos = _words(read.text("videos"), k, "videos")
    for i, video_id in enumerate(videos):
        check_id(f"videos.{i}", video_id, max_id_length)
    sources = _words(read.text("sources"), k, "sources")
    if read.at != len(value):
        raise InvalidInput("body", f"{len(value) - read.at} bytes past the record's end")
    return ServedRecord(
        recommendation_id=recommendation_id,
        user_id=user_id,
        ts_ms=ts_ms,
        model_version=model_version,
        schema_hash=schema_hash,
        context=context,
        items=ServedItems(videos, positions, scores, sources),
        request_values=request,
        item_values=values,
        arm=arm,
    )


def _context(text: str) -> EventContext:
    try:
        return EventContext.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidInput("context", str(exc.errors(include_url=False)[0]["msg"])) from exc


def _words(text: str, count: int, field: str) -> list[str]:
    """``count`` space-separated non-empty words of ``text``."""
    words = text.split(" ") if count else ([] if not text else [text])
    if len(words) != count or not all(words):
        raise InvalidInput(field, f"{len(words)} names for {count} items (or an empty one)")
    return words
