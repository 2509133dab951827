"""The video catalog: what can be recommended, by whom, about what.

A :class:`CatalogStore` holds :class:`Video` records; ``memory`` (embedded,
snapshotted to disk) and ``redis`` backends sit beside this file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from feature_store.errors import InvalidInput
from feature_store.events import check_id, strict_input, translate_pydantic_error
from feature_store.settings import EventLimits

MAX_TITLE_CHARS = 300
MAX_DESCRIPTION_CHARS = 5000


class Video(BaseModel):
    """One video in the catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    video_id: str = Field(max_length=1024)
    creator_id: str = Field(max_length=1024)
    category: str = Field(max_length=64)
    tags: tuple[str, ...] = ()
    """Free-form topic tags; each at most 64 characters."""
    duration_ms: int = Field(gt=0)
    """Length of the video in ms."""
    uploaded_at: int = Field(ge=0)
    """Upload time, ms since the Unix epoch."""
    hidden: bool = False
    """Hidden videos are never recommended (takedowns, privacy, quality)."""
    title: str = Field("", max_length=MAX_TITLE_CHARS)
    """What the video is called. Its words (and pairs of words) are a feature of the
    ranker and the video tower (``title_tokens``), so a video nobody has watched yet has
    a meaningful vector from its first request."""
    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS)
    """Optional longer text; its first words count with the title's."""


def validate_video(data: object, limits: EventLimits, now_ms: int | None = None) -> Video:
    """Validate one decoded JSON catalog record, strictly (as :meth:`EventValidator.parse_obj`),
    against the limits; raises :class:`InvalidInput`.

    ``uploaded_at`` may lie at most ``limits.future_tolerance_ms`` after ``now_ms`` (the
    receiver's clock by default), as an event's ``ts``: a future upload would be "fresh"
    for as long as it stays in the future and would get a cold-start prior it never earned.
    """
    if not isinstance(data, dict):
        raise InvalidInput("body", "a video must be a JSON object")
    try:
        video = Video.model_validate(strict_input(data), strict=True)
    except PydanticValidationError as exc:
        raise translate_pydantic_error(exc) from exc
    check_id("video_id", video.video_id, limits.max_id_length)
    check_id("creator_id", video.creator_id, limits.max_id_length)
    check_id("category", video.category, 64)
    if len(video.tags) > limits.max_tags:
        raise InvalidInput("tags", f"at most {limits.max_tags} tags")
    for i, tag in enumerate(video.tags):
        check_id(f"tags.{i}", tag, 64)
    if video.duration_ms > limits.max_watch_ms:
        raise InvalidInput("duration_ms", f"must be at most {limits.max_watch_ms}")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if video.uploaded_at > now + limits.future_tolerance_ms:
        raise InvalidInput(
            "uploaded_at",
            f"{video.uploaded_at} is more than {limits.future_tolerance_ms} ms in the future",
        )
    return video


@runtime_checkable
class CatalogStore(Protocol):
    """Where videos live. Backends: ``memory`` and ``redis``.

    Reads return ``None`` for unknown ids instead of raising, because serving
    meets unknown ids routinely (a candidate list from the caller, a video
    deleted since it was watched).
    """

    def upsert(self, videos: Sequence[Video]) -> None:
        """Insert or replace videos (keeps nothing of a replaced record)."""
        ...

    def get(self, video_id: str) -> Video | None: ...

    def get_many(self, video_ids: Sequence[str]) -> list[Video | None]:
        """Videos in the order asked, ``None`` where unknown; one round trip."""
        ...

    def set_hidden(self, video_id: str, hidden: bool) -> Video:
        """Hide or unhide; raises :class:`~feature_store.errors.NotFound` if unknown."""
        ...

    def recent(self, limit: int, since_ms: int | None = None) -> list[Video]:
        """Newest uploads first (hidden ones excluded), for fresh-upload candidates."""
        ...

    def count(self) -> int: ...

    def iter_all(self) -> Iterable[Video]: ...

    def snapshot(self, directory: Path) -> None:
        """Write every video to ``directory`` (atomically replaces an old snapshot)."""
        ...

    def restore(self, directory: Path) -> int:
        """Load a snapshot written by any backend; returns the number of videos."""
        ...

    def close(self) -> None: ...
