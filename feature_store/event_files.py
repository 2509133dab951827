"""Files of events and of videos: what ``vidrec replay``, ``vidrec backfill`` and ``vidrec eval``
read besides MovieLens.

**Events** (CSV with a header, Parquet, or JSON lines of the event objects
``POST /v1/events`` takes): one row per event, columns named
after :class:`~feature_store.events.Event`'s fields (``event_id, user_id,
video_id, type, ts`` required; ``watch_ms, duration_ms, recommendation_id,
model_version`` optional) and, optionally, :class:`~feature_store.events.EventContext`'s
(``device, os, country, surface, position, age_group, gender, occupation``).
An unknown column is refused (a typo such as ``timestamp`` would otherwise
read as a missing field on every row).

**Videos** (CSV, JSON lines or Parquet): one row per video, columns named
after :class:`~feature_store.catalog.base.Video`'s fields; in a CSV, ``tags``
are separated by ``|``. ``uploaded_at`` may be left out: the video is then
taken as uploaded one day before the first event, as MovieLens movies are.

Bad rows never sink the file: each is skipped with a reason naming its line
and field (:class:`Rejected`), and the good rows next to it are kept; a file
with no good row is an error.

Time: every ``ts`` is ms since the epoch. A file whose first event is older
than ``limits.min_ts_ms`` (the events' lower limit: older times are refused
at ingress) is shifted as a whole by :func:`time_shift`, as MovieLens is
(first event one day after the limit, last not in the future), and so are
the videos' ``uploaded_at``; the shift is returned so callers can say so.
Nothing is dropped for being old.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from feature_store.catalog.base import Video, validate_video
from feature_store.errors import InvalidInput, NotFound
from feature_store.events import (
    Event,
    EventContext,
    EventValidator,
    translate_pydantic_error,
)
from feature_store.settings import EventLimits

EVENT_COLUMNS = ("event_id", "user_id", "video_id", "type", "ts")
"""Columns every events file has."""
_OPTIONAL_EVENT_COLUMNS = ("watch_ms", "duration_ms", "recommendation_id", "model_version")
_CONTEXT_COLUMNS = tuple(EventContext.model_fields)
VIDEO_COLUMNS = ("video_id", "creator_id", "category", "duration_ms")
"""Columns every videos file has (``tags``, ``uploaded_at``, ``hidden`` are optional)."""
_OPTIONAL_VIDEO_COLUMNS = ("tags", "uploaded_at", "hidden")
_DAY_MS = 86_400_000
_EXAMPLES = 10
"""Rejected rows quoted in full (the rest are counted)."""


@dataclass
class Rejected:
    """Rows skipped because they broke the data contract, with the first few reasons."""

    count: int = 0
    examples: list[str] = field(default_factory=list)
    """``"<file>:<line>: <field>: <reason>"`` for the first rejected rows."""

    def add(self, where: str, error: InvalidInput) -> None:
        self.count += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(f"{where}: {error}")

    def describe(self) -> str:
        unquoted = self.count - len(self.examples)
        more = f" (and {unquoted} more)" if unquoted else ""
        return f"{self.count} rows rejected: " + "; ".join(self.examples) + more


@dataclass
class EventsFile:
    """The valid events of a file in time order, and what was done to get them."""

    events: list[Event]
    """Sorted by ``ts`` (stable: equal times keep the file's order), shifted."""
    shift_ms: int
    """Added to every ``ts`` (0 when the file was within the limits)."""
    rejected: Rejected


def time_shift(first_ms: int, last_ms: int, min_ts_ms: int, now_ms: int | None = None) -> int:
    """Constant added to every timestamp of a dataset: 0 when its first event is at or
    after ``min_ts_ms``; else enough to put it one day after, clipped so that the last
    event is not in the future (relative timing unchanged)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    shift = max(0, min_ts_ms + _DAY_MS - first_ms)
    return min(shift, now - last_ms) if last_ms + shift > now else shift


def file_format(path: Path) -> str:
    """``csv``, ``parquet`` or ``jsonl`` from the file's suffix."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".parquet"):
        return suffix[1:]
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise InvalidInput("dataset", f"{path}: expected a .csv, .parquet or .jsonl file")


def _rows(path: Path, fmt: str) -> tuple[list[str], Iterable[tuple[int, Mapping[str, Any]]]]:
    """The file's column names and its rows, numbered as a person counts lines."""
    if not path.is_file():
        raise NotFound(f"{path} does not exist")
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = [(reader.line_num, row) for row in reader]
            return list(reader.fieldnames or []), rows
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise InvalidInput(
                "format", "reading Parquet needs pyarrow: pip install 'vidrec[parquet]'"
            ) from exc
        table = pq.read_table(path)
        return list(table.column_names), enumerate(table.to_pylist(), start=1)
    if fmt == "jsonl":
        return [], _json_lines(path)
    raise InvalidInput("format", f"unknown file format {fmt!r}")


def _json_lines(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, {"__error__": f"not JSON ({exc.msg})"}


def _check_columns(path: Path, columns: list[str], required: tuple[str, ...],
                   optional: Iterable[str]) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise InvalidInput("columns", f"{path}: missing column(s) {', '.join(missing)}")
    known = {*required, *optional}
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise InvalidInput(
            "columns", f"{path}: unknown column(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )


def _present(value: Any) -> bool:
    return value is not None and value != ""


def row_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as the JSON object ``POST /v1/events`` takes: empty cells left out, the
    context columns gathered under ``context``."""
    data: dict[str, Any] = {}
    context: dict[str, Any] = {}
    for key, value in row.items():
        if _present(value):
            (context if key in _CONTEXT_COLUMNS else data)[key] = value
    if context:
        data["context"] = context
    return data


def event_from_row(row: Mapping[str, Any]) -> Event:
    """One row as an event (structure and types only); raises :class:`InvalidInput`."""
    try:
        return Event.model_validate(row_fields(row))
    except PydanticValidationError as exc:
        raise translate_pydantic_error(exc) from exc


@dataclass(frozen=True)
class UnreadableRow:
    """A row that is no event at all (a field missing, a wrong type or kind)."""

    where: str
    """``<file>:<line>``."""
    fields: dict[str, Any]
    """The row as read (:func:`row_fields`)."""
    error: InvalidInput


def parse_event_rows(
    path: Path, fmt: str = "auto"
) -> tuple[list[tuple[str, Event]], list[UnreadableRow]]:
    """Every row of an events file: ``(where, event)`` for those with an event's
    structure (the limits not checked yet), and the unreadable ones, in file order."""
    path = Path(path)
    fmt = file_format(path) if fmt == "auto" else fmt
    columns, rows = _rows(path, fmt)
    if fmt != "jsonl":
        _check_columns(path, columns, EVENT_COLUMNS, (*_OPTIONAL_EVENT_COLUMNS,
                                                      *_CONTEXT_COLUMNS))
    parsed: list[tuple[str, Event]] = []
    unreadable: list[UnreadableRow] = []
    for line, row in rows:
        where = f"{path.name}:{line}"
        try:
            if "__error__" in row:
                raise InvalidInput("line", str(row["__error__"]))
            parsed.append((where, event_from_row(row)))
        except InvalidInput as exc:
            fields = {} if "__error__" in row else row_fields(row)
            unreadable.append(UnreadableRow(where, fields, exc))
    return parsed, unreadable


def read_events(
    path: Path, limits: EventLimits, fmt: str = "auto", now_ms: int | None = None
) -> EventsFile:
    """The valid events of an events file, shifted when older than ``limits.min_ts_ms``."""
    path = Path(path)
    parsed, unreadable = parse_event_rows(path, fmt)
    rejected = Rejected()
    for row in unreadable:
        rejected.add(row.where, row.error)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    shift = 0
    if parsed:
        times = [e.ts for _, e in parsed]
        shift = time_shift(min(times), max(times), limits.min_ts_ms, now)
    validator = EventValidator(limits)
    events: list[Event] = []
    for where, event in parsed:
        if shift:
            event = event.model_copy(update={"ts": event.ts + shift})
        try:
            validator.check(event, now)
        except InvalidInput as exc:
            rejected.add(where, exc)
            continue
        events.append(event)
    if not events:
        detail = f": {rejected.describe()}" if rejected.count else ""
        raise InvalidInput("dataset", f"{path}: no valid events{detail}")
    events.sort(key=lambda e: e.ts)
    return EventsFile(events, shift, rejected)


def _video_row(row: Mapping[str, Any], default_uploaded_at: int, shift_ms: int) -> dict[str, Any]:
    """A videos-file row as the JSON object ``PUT /v1/videos`` takes: a CSV's text made
    numbers, booleans and a tag list (the catalog validates strictly)."""
    data = {k: v for k, v in row.items() if _present(v)}
    tags = data.get("tags")
    if isinstance(tags, str):
        data["tags"] = [t for t in tags.split("|") if t]
    hidden = data.get("hidden")
    if isinstance(hidden, str):
        data["hidden"] = hidden.strip().lower() in ("1", "true", "yes")
    for name in ("duration_ms", "uploaded_at"):
        value = data.get(name)
        if isinstance(value, str):
            try:
                data[name] = int(value)
            except ValueError:
                raise InvalidInput(name, f"must be an integer, not {value[:32]!r}") from None
    if "uploaded_at" in data:
        if isinstance(data["uploaded_at"], int):
            data["uploaded_at"] += shift_ms
    else:
        data["uploaded_at"] = default_uploaded_at
    return data


def read_videos(
    path: Path, limits: EventLimits, first_event_ts: int, shift_ms: int = 0, fmt: str = "auto"
) -> tuple[list[Video], Rejected]:
    """The valid videos of a videos file (see the module doc), ``uploaded_at`` shifted like
    the events (``shift_ms``) or, where absent, one day before ``first_event_ts``."""
    path = Path(path)
    fmt = file_format(path) if fmt == "auto" else fmt
    columns, rows = _rows(path, fmt)
    if fmt != "jsonl":
        _check_columns(path, columns, VIDEO_COLUMNS, _OPTIONAL_VIDEO_COLUMNS)
    rejected = Rejected()
    videos: dict[str, Video] = {}
    for line, row in rows:
        where = f"{path.name}:{line}"
        try:
            if "__error__" in row:
                raise InvalidInput("line", str(row["__error__"]))
            data = _video_row(row, max(0, first_event_ts - _DAY_MS), shift_ms)
            video = validate_video(data, limits)
        except InvalidInput as exc:
            rejected.add(where, exc)
            continue
        videos[video.video_id] = video  # a later row of the same id replaces it, as upsert does
    if not videos:
        detail = f": {rejected.describe()}" if rejected.count else ""
        raise InvalidInput("catalog", f"{path}: no valid videos{detail}")
    return list(videos.values()), rejected
