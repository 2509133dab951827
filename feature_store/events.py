"""The event contract: what a video site reports about what its users did.

Every event enters through :class:`EventValidator` (HTTP ingress and the
stream consumer alike), so a bad value is refused with a message that names
its field and never reaches training.

What each event type means to labels, histories, counters and signals is
declared once, in :mod:`feature_store.event_types` (``EventType`` is
re-exported here).

Units: every time is milliseconds since the Unix epoch (``ts``) or a duration
in milliseconds (``watch_ms``, ``duration_ms``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from feature_store.errors import InvalidInput
from feature_store.event_types import EventType
from feature_store.settings import EventLimits

ID_CHARSET = re.compile(r"^[A-Za-z0-9_.:@/+=-]+$")
"""Characters allowed in ids: URL- and log-safe, no spaces or control bytes."""
ID_CHARSET_TEXT = "letters, digits and _.:@/+=-"

_ID_CHARS = r"[A-Za-z0-9_.:@/+=-]+"
_ID = re.compile(_ID_CHARS)
"""One id, used with ``fullmatch``: unlike ``ID_CHARSET.match``, whose ``$`` also
matches before a final newline, it refuses an id that ends in ``\\n``."""
_THREE_IDS = re.compile(f"{_ID_CHARS} {_ID_CHARS} {_ID_CHARS}")
"""``event_id user_id video_id`` joined by spaces, used with ``fullmatch``.

A space is outside the charset, so the joined string matches exactly when
each of the three ids is non-empty and made of allowed characters: one
regex call instead of three on the decode path (the stream consumer checks
every record). When it does not match, :func:`check_id` runs per field to
name the one that failed."""

def _integral(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


INTEGRAL = BeforeValidator(_integral)
"""Makes a strict ``int`` take integers as JSON Schema says them: ``5`` and ``5.0``, not
``"5"``, ``true`` nor ``5.5`` (a plain strict ``int`` refuses ``5.0`` too). Constraints go
before it (``Annotated[int, Field(ge=1), INTEGRAL]``) so that the schema shows them."""

JsonInt = Annotated[int, INTEGRAL]
"""An integer field of a strict model (:data:`INTEGRAL`)."""

_HARD_MAX = 1024
"""Absolute bound on any string before the configurable limits are checked."""


class EventContext(BaseModel):
    """Where and how the event happened. Every field is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    device: str | None = Field(None, max_length=32)
    """Device class, e.g. ``phone``, ``tv``, ``desktop``."""
    os: str | None = Field(None, max_length=32)
    country: str | None = Field(None, max_length=8)
    """ISO 3166 code, e.g. ``US``."""
    surface: str | None = Field(None, max_length=32)
    """Where in the product: ``home``, ``search``, ``related``..."""
    # Strict on its own, as the API's schema says: a recommend request carries a
    # context and is otherwise validated strictly.
    position: Annotated[int, Field(ge=0, le=10_000, strict=True), INTEGRAL] | None = None
    """Rank at which the video was shown (0 = first)."""
    # Profile facts a client may know about its signed-in user, sent like
    # ``country``; read as features only when ``features.user_attributes`` is on.
    age_group: str | None = Field(None, max_length=16)
    """Age bracket, e.g. ``25-34``."""
    gender: str | None = Field(None, max_length=16)
    occupation: str | None = Field(None, max_length=32)


class Event(BaseModel):
    """One user action on one video."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    event_id: str = Field(max_length=_HARD_MAX)
    """Idempotency key: the same ``event_id`` twice is the same event."""
    user_id: str = Field(max_length=_HARD_MAX)
    video_id: str = Field(max_length=_HARD_MAX)
    type: EventType
    ts: int
    """Event time, ms since the Unix epoch."""
    watch_ms: int = 0
    """Milliseconds watched (play, progress, finish); 0 otherwise."""
    duration_ms: int | None = None
    """The video's length in ms when the client knows it."""
    recommendation_id: str | None = Field(None, max_length=_HARD_MAX)
    """The ``recommendation_id`` of the response that showed this video."""
    model_version: str | None = Field(None, max_length=_HARD_MAX)
    context: EventContext = EventContext()

    def watch_ratio(self, fallback_duration_ms: int | None = None) -> float | None:
        """Fraction of the video watched, capped at 1; None without a duration."""
        duration = self.duration_ms or fallback_duration_ms
        if not duration:
            return None
        return min(1.0, self.watch_ms / duration)


def _field_of(error: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "body"


def translate_pydantic_error(exc: PydanticValidationError, prefix: str = "") -> InvalidInput:
    """The first error of ``exc`` as :class:`InvalidInput` naming its field."""
    first = exc.errors(include_url=False)[0]
    field = _field_of(first)
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "enum":
        expected = first["ctx"]["expected"]
        message = f"unknown value {first.get('input')!r}; expected one of {expected}"
    else:
        message = first["msg"]
    return InvalidInput(f"{prefix}{field}", message)


class EventValidator:
    """Validates events against the configured :class:`EventLimits`.

    Structure and types come from the pydantic model; the limits that depend
    on configuration or on the clock (id length, watch bounds, how far in the
    future ``ts`` may be) are checked here so both ingress paths share them.
    """

    def __init__(self, limits: EventLimits) -> None:
        self.limits = limits

    def parse_json(self, data: bytes | str, now_ms: int | None = None) -> Event:
        """Decode and validate one JSON event; raises :class:`InvalidInput`."""
        try:
            event = Event.model_validate_json(data)
        except PydanticValidationError as exc:
            raise translate_pydantic_error(exc) from exc
        self.check(event, now_ms)
        return event

    def parse_obj(self, data: object, now_ms: int | None = None) -> Event:
        """Validate one already-decoded JSON event (an item of an HTTP batch).

        Validated strictly, with JSON's types: ``"5"`` is not an integer nor
        ``1`` a boolean, as the API's schema says (:func:`strict_input`).
        Raises :class:`InvalidInput`.
        """
        if not isinstance(data, dict):
            raise InvalidInput("body", "an event must be a JSON object")
        prepared = strict_input(data)
        kind = prepared.get("type")
        if isinstance(kind, str):  # strict mode wants the member, not its value
            if kind not in _EVENT_TYPES:
                expected = ", ".join(repr(value) for value in _EVENT_TYPES)
                raise InvalidInput("type", f"unknown value {kind!r}; expected one of {expected}")
            prepared["type"] = _EVENT_TYPES[kind]
        try:
            event = Event.model_validate(prepared, strict=True)
        except PydanticValidationError as exc:
            raise translate_pydantic_error(exc) from exc
        self.check(event, now_ms)
        return event

    def check(self, event: Event, now_ms: int | None = None) -> None:
        """Apply the configured limits to a structurally valid event."""
        limits = self.limits
        max_id = limits.max_id_length
        event_id, user_id, video_id = event.event_id, event.user_id, event.video_id
        if not (
            len(event_id) <= max_id
            and len(user_id) <= max_id
            and len(video_id) <= max_id
            and _THREE_IDS.fullmatch(f"{event_id} {user_id} {video_id}")
        ):  # the slow path names the first failing field, in field order
            check_id("event_id", event_id, max_id)
            check_id("user_id", user_id, max_id)
            check_id("video_id", video_id, max_id)
        if event.recommendation_id is not None:
            check_id("recommendation_id", event.recommendation_id, limits.max_id_length)
        if event.model_version is not None:
            check_id("model_version", event.model_version, limits.max_id_length)
        if not 0 <= event.watch_ms <= limits.max_watch_ms:
            raise InvalidInput("watch_ms", f"must be between 0 and {limits.max_watch_ms}")
        if event.duration_ms is not None and not 0 < event.duration_ms <= limits.max_watch_ms:
            raise InvalidInput("duration_ms", f"must be between 1 and {limits.max_watch_ms}")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if event.ts > now + limits.future_tolerance_ms:
            raise InvalidInput(
                "ts", f"{event.ts} is more than {limits.future_tolerance_ms} ms in the future"
            )
        if event.ts < limits.min_ts_ms:
            raise InvalidInput("ts", f"must be at least {limits.min_ts_ms} (ms since epoch)")


def strict_input(data: dict[str, Any]) -> dict[str, Any]:
    """A decoded JSON object made ready for strict (``strict=True``) Python-mode validation.

    Strict validation takes JSON's types as JSON Schema does: ``"5"`` is not an
    integer nor ``1`` a boolean. Two things JSON cannot carry are made here
    (a shallow copy): a whole float is an integer (``5.0``), and a list
    stands for a tuple. Nested objects are left to their own fields
    (``EventContext.position`` takes ``5.0`` through :data:`INTEGRAL`).
    About 1 us an event more than lax validation; going through JSON text
    again would cost 3 us.
    """
    return {
        key: tuple(value) if isinstance(value, list) else _integral(value)
        for key, value in data.items()
    }


_EVENT_TYPES = {kind.value: kind for kind in EventType}


def check_id(field: str, value: str, max_length: int) -> None:
    """Refuse an empty, overlong or oddly-charactered id, naming ``field``."""
    if not value:
        raise InvalidInput(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidInput(field, f"longer than {max_length} characters")
    if not _ID.fullmatch(value):
        raise InvalidInput(field, f"may contain only {ID_CHARSET_TEXT}")


def encode_event(event: Event) -> bytes:
    """Wire format of an event on the log: compact JSON, unset optionals left out."""
    return event.model_dump_json(exclude_none=True, exclude_defaults=True).encode()
