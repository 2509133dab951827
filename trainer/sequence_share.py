"""A group's chosen views, shared through Redis so that one tower learns every user.

With several trainers (``trainer.group_sync``) each reads only its
partitions, that is its share of the users. The ranker and the retrieval
towers are averaged across the group (:mod:`trainer.distributed`), but the
sequence tower is refit from the users' views in order, and an average of
towers whose item codes were assigned in each trainer's own order means
nothing. So the group trains one tower, the exporter's, on everyone's views:

- every trainer appends the chosen views of each batch it trains to one
  capped Redis stream (``TRAINER_SEQUENCE_VIEWS{group}``, one entry per
  view, at most ``sequence.max_views`` entries: the views a tower keeps);
- every trainer reads the whole stream back, in its order, into its own
  :class:`~trainer.sequence.SequenceTrainer`, so all hold the same views and
  codes, and whichever holds the exporter lease next already has them;
- only the exporter refits (:mod:`trainer.stages.sequence`); a new exporter
  refits from scratch on the views at once, and its versions carry no tower
  until that first refit is done.

A user's views reach the stream in order (a user's events are in one
partition, trained by one member at a time). A batch trained again after a
SIGKILL appends its views again; a repeated view of a video moves to the end
of the user's views (as the served history does), so it changes nothing.
While Redis is down the views are not shared (counted, the warning rate
limited) and training goes on; the stream position is kept in the
checkpoint, so a restart reads on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from feature_store.constants import TRAINER_SEQUENCE_VIEWS
from feature_store.runtime.log_summary import LogSummary

log = logging.getLogger(__name__)

READ_AT_MOST = 20_000
"""Views read back per batch (the trainer's thread does the reading; the rest waits for
the next batch)."""
_PAGE = 5_000
WARNINGS = LogSummary(log, every_s=30.0)
"""While Redis is down: each kind of failure said once, then a count every 30 s."""


class SharedViews:
    """One trainer's end of its group's stream of views (see the module doc)."""

    def __init__(self, client: Any, group_id: str, max_views: int) -> None:
        self.client = client
        self.key = TRAINER_SEQUENCE_VIEWS + group_id
        self.max_views = max_views
        self.last_id = "0-0"
        """The newest entry read (the stream's ids increase)."""
        self.published = 0
        self.read_back = 0
        self.failures = 0

    def publish(self, views: Sequence[tuple[str, str]]) -> bool:
        """Append ``views`` in order; False (counted) when Redis refused them."""
        if not views:
            return True
        try:
            pipe = self.client.pipeline(transaction=False)
            for user_id, video_id in views:
                pipe.xadd(self.key, {"u": user_id, "v": video_id},
                          maxlen=self.max_views, approximate=True)
            pipe.execute()
        except RedisError as exc:
            self._failed("publish", len(views), exc)
            return False
        self.published += len(views)
        return True

    def read(self) -> list[tuple[str, str]]:
        """The views appended since the last read (every member's), at most
        :data:`READ_AT_MOST`; none while Redis is down."""
        out: list[tuple[str, str]] = []
        try:
            while len(out) < READ_AT_MOST:
                entries = self.client.xrange(self.key, f"({self.last_id}", "+", count=_PAGE)
                for entry_id, fields in entries:
                    user_id, video_id = _field(fields, "u"), _field(fields, "v")
                    if user_id and video_id:  # anything else was not written here
                        out.append((user_id, video_id))
                    self.last_id = _text(entry_id)
                if len(entries) < _PAGE:
                    break
        except RedisError as exc:
            self._failed("read", 0, exc)
        self.read_back += len(out)
        return out

    def status(self) -> dict[str, Any]:
        return {"published": self.published, "read": self.read_back,
                "failures": self.failures, "position": self.last_id}

    def _failed(self, what: str, views: int, exc: Exception) -> None:
        self.failures += 1
        WARNINGS.record(f"sequence views: {what} failed", f"{views} views not shared: {exc!r}")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(fields: dict[Any, Any], name: str) -> str:
    """A field of an entry, whether the client decodes responses or not."""
    value = fields.get(name.encode(), fields.get(name))
    return _text(value if value is not None else "")
