"""Recommendation ids the service recognises as its own when events name them.

Clients send a response's ``recommendation_id`` back on their events; the
trainer joins impressions to the served log by it, and the experiment feed
attributes events to an arm by it. Both wait a moment for a served record
they have not read yet (the service writes it just after answering), so an id
the service never issued (a client bug, ids from another deployment, a typo)
would make every batch naming it wait, and would count as a lost join.

So an id carries a tag: 24 random hex digits, then the first 8 hex digits of
HMAC-SHA256 of them, keyed by a secret derived from ``api.admin_key`` (every
API process of a deployment has it; no state, no look-up). Ingest keeps an
event whose id does not verify, without the id, and says so (the batch
answer's ``warnings``, ``vidrec_unknown_recommendation_ids_total``): the event
still trains and counts, it is just not attributed to a response.

Changing the admin key makes the ids issued before it unknown: events about
responses served in the minutes before the change lose their attribution.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

RANDOM_HEX = 24
"""Hex digits of randomness (96 bits: no collision in 10^12 responses)."""
TAG_HEX = 8
"""Hex digits of the tag (a made-up id passes once in 4 billion)."""
_DERIVATION = b"vidrec recommendation ids v1\x00"


class RecommendationIds:
    """Issues tagged recommendation ids and recognises them (see the module docstring)."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(_DERIVATION + secret).digest()

    @classmethod
    def for_key(cls, admin_key: str) -> RecommendationIds:
        """The ids of a deployment whose API processes share ``admin_key``."""
        return cls(admin_key.encode())

    def _tag(self, random_part: str) -> str:
        digest = hmac.new(self._key, random_part.encode(), hashlib.sha256).hexdigest()
        return digest[:TAG_HEX]

    def issue(self) -> str:
        """A new id: 32 lowercase hex digits, like a UUID's."""
        random_part = secrets.token_hex(RANDOM_HEX // 2)
        return random_part + self._tag(random_part)

    def issued(self, recommendation_id: str) -> bool:
        """Whether this deployment issued ``recommendation_id``."""
        if len(recommendation_id) != RANDOM_HEX + TAG_HEX:
            return False
        random_part, tag = recommendation_id[:RANDOM_HEX], recommendation_id[RANDOM_HEX:]
        return hmac.compare_digest(self._tag(random_part), tag)
