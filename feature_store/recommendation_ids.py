"""Recommendation ids the service recognises as its own when events name them.

Clients send a response's ``recommendation_id`` back on their events; the
trainer joins impressions to the served log by it, and the experiment feed
attributes events to an arm by it. Both wait a moment for a served record
they have not read yet (the service writes it just after answering), so an id
the service never issued (a client bug, ids from another deployment, a typo)
would make every batch naming it wait, and would count as a lost join.

So an id says two things:

- **whether its response was logged** (its first hex digit: ``1`` when a
  model ranked it and the served log was on, so a record was written;
  ``0`` for a fallback, which nothing logs): readable by anyone
  (:func:`logged_response`), so a reader of the served log need not wait for
  a record that was never written;
- **that this deployment issued it**: the last 8 hex digits are the first
  8 of HMAC-SHA256 of the first 24, keyed by a secret derived from
  ``api.admin_key`` (every API process of a deployment has it; no state, no
  look-up). Ingest keeps an event whose id does not verify, without the id,
  and says so (the batch answer's ``warnings``,
  ``vidrec_unknown_recommendation_ids_total``): the event still trains and
  counts, it is just not attributed to a response.

Changing the admin key (or upgrading from ids without a tag) makes the ids
issued before it unknown: events about responses served in the minutes
before lose their attribution.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

HEAD_HEX = 24
"""Hex digits before the tag: the kind, then 23 random ones (92 bits: no collision in
10^12 responses)."""
TAG_HEX = 8
"""Hex digits of the tag (a made-up id passes once in 4 billion)."""
LOGGED, NOT_LOGGED = "1", "0"
"""The first hex digit: the served log holds a record of this response, or not."""
_DERIVATION = b"vidrec recommendation ids v1\x00"


def logged_response(recommendation_id: str) -> bool:
    """Whether the service wrote a served-log record for this response (a model ranked it
    and the served log was on); False for a fallback's id and for ids not of this form."""
    return len(recommendation_id) == HEAD_HEX + TAG_HEX and recommendation_id[0] == LOGGED


class RecommendationIds:
    """Issues tagged recommendation ids and recognises them (see the module docstring)."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(_DERIVATION + secret).digest()

    @classmethod
    def for_key(cls, admin_key: str) -> RecommendationIds:
        """The ids of a deployment whose API processes share ``admin_key``."""
        return cls(admin_key.encode())

    def _tag(self, head: str) -> str:
        return hmac.new(self._key, head.encode(), hashlib.sha256).hexdigest()[:TAG_HEX]

    def issue(self, logged: bool) -> str:
        """A new id, 32 lowercase hex digits like a UUID's; ``logged``: the response's
        record goes to the served log."""
        head = (LOGGED if logged else NOT_LOGGED) + secrets.token_hex(12)[: HEAD_HEX - 1]
        return head + self._tag(head)

    def issued(self, recommendation_id: str) -> bool:
        """Whether this deployment issued ``recommendation_id``."""
        if len(recommendation_id) != HEAD_HEX + TAG_HEX:
            return False
        head, tag = recommendation_id[:HEAD_HEX], recommendation_id[HEAD_HEX:]
        return hmac.compare_digest(self._tag(head), tag)
