"""The served log's record: what the service recommended, and the features it scored.

Every recommend response that a model ranked is logged to a stream beside the
event log (the ``served`` topic): its ``recommendation_id``, the user, the
moment, the model version, the request's context, and per served item its
position, score and source, with the **feature values the model scored**.
Clients send the ``recommendation_id`` back on their events; the trainer
joins an impression to its served item and trains on those values instead of
recomputing them (the industry's log-features-at-serving-time pattern), so
what the model learns from is exactly what it was shown.

What is logged (and why it is small): the packed values of
:mod:`feature_store.features.values`, split by the sources' declarations
into the part every item of a response shares (user and context keys, the
history: ``request``) and the part per item (video keys, tags, every dense
value: ``values``), and only for the top ``served_log.max_items`` items (the
ones a client can show). With the default schema that is 28 slots once plus
22 slots (176 bytes) per item: about 5 KB of JSON for a 20-item response.
The cost per request is measured in ``bench/bench_serving.py``.

Wire format: one JSON object per record (base64 for the two arrays, little
endian uint64), versioned by ``v``. The decoder checks ids, sizes and that
the arrays have the widths the record states; whether those widths fit the
reader's schema is the reader's business (``schema`` names the schema hash).

Versions: ``v: 2`` adds ``experiment`` and ``arm`` (the experiment arm whose
model ranked the response, :mod:`feature_store.experiments`); a record
outside any experiment is still written as ``v: 1``, so readers that know
only version 1 (a trainer not yet upgraded) keep joining every record but
the experiment's (which they dead-letter, and featurise those impressions
from the stores). Both versions decode here.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from feature_store.errors import InvalidInput
from feature_store.events import EventContext, check_id

FORMAT_VERSION = 2
"""The newest version written (only by records that carry an arm: see the module doc)."""
_VERSIONS = (1, 2)
_HARD_MAX_ITEMS = 10_000


class ServedItem(NamedTuple):
    """One served item (a tuple: up to ``max_items`` are built per response)."""

    video_id: str
    position: int
    """Rank in the response, 0 first."""
    score: float
    """The model's score when it was served."""
    source: str
    """The candidate source that proposed it."""


class ServedArm(NamedTuple):
    """The experiment arm that ranked a response."""

    experiment: str
    arm: str


@dataclass(frozen=True)
class ServedRecord:
    """One logged response (see the module docstring)."""

    recommendation_id: str
    user_id: str
    ts_ms: int
    """The moment the features were computed at (the request's clock), ms since epoch."""
    model_version: str | None
    schema_hash: str
    context: EventContext
    items: tuple[ServedItem, ...]
    request_values: npt.NDArray[np.uint64]
    """``(R,)`` the slots every item shares (the layout's ``request_slots``)."""
    item_values: npt.NDArray[np.uint64]
    """``(K, I)`` the other slots, per item in ``items`` order (``item_slots``)."""
    arm: ServedArm | None = None
    """The experiment arm whose model ranked it (None: the active version, no experiment)."""

    def position_of(self, video_id: str) -> int | None:
        """Index in ``items`` of ``video_id``, None if it was not served here."""
        for i, item in enumerate(self.items):
            if item.video_id == video_id:
                return i
        return None


def _array_text(values: npt.NDArray[np.uint64]) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype="<u8").tobytes()).decode()


def encode_served(record: ServedRecord) -> bytes:
    """The record as compact JSON (see the module docstring)."""
    data: dict[str, Any] = {
        "v": 1 if record.arm is None else FORMAT_VERSION,
        "recommendation_id": record.recommendation_id,
        "user_id": record.user_id,
        "ts": record.ts_ms,
        "schema": record.schema_hash,
        "context": record.context.model_dump(exclude_none=True),
        # Parallel lists, positions implicit: flat lists encode faster than a list of lists.
        "videos": [i.video_id for i in record.items],
        "positions": [i.position for i in record.items],
        "scores": [i.score for i in record.items],
        "sources": [i.source for i in record.items],
        "widths": [len(record.request_values), record.item_values.shape[1]],
        "request": _array_text(record.request_values),
        "values": _array_text(record.item_values),
    }
    if record.model_version is not None:
        data["model_version"] = record.model_version
    if record.arm is not None:
        data["experiment"], data["arm"] = record.arm
    return json.dumps(data, separators=(",", ":")).encode()


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


def _items(data: dict[str, Any], max_id_length: int) -> tuple[ServedItem, ...]:
    lists = [data.get(name) for name in ("videos", "positions", "scores", "sources")]
    if not all(isinstance(x, list) for x in lists):
        raise InvalidInput("videos", "videos, positions, scores and sources must be lists")
    videos, positions, scores, sources = lists
    assert isinstance(videos, list)
    if len(videos) > _HARD_MAX_ITEMS or len({len(x) for x in lists if isinstance(x, list)}) > 1:
        raise InvalidInput("videos", f"at most {_HARD_MAX_ITEMS} items, as many in each list")
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
    return tuple(items)


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


def decode_served(value: bytes, max_id_length: int) -> ServedRecord:
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
