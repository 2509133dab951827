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
ones a client can show). With the default schema that is 112 slots once
(the history and the recent actions) plus 43 slots (344 bytes) per item:
about 8.5 KB for a 20-item response (11.5 KB as JSON). The cost
per request is measured in ``bench/bench_serving.py``.

Wire formats, told apart by a record's first byte:

- version 3, binary (:mod:`feature_store.served.binary`): what services
  write. Its first byte is 3.
- versions 1 and 2, JSON (:mod:`feature_store.served.json_v2`): what
  services wrote before; still read, so that a trainer upgraded first keeps
  joining the records of services not yet upgraded. Its first byte is ``{``.

A rolling upgrade goes trainers first: a trainer that reads only JSON
dead-letters the binary records (as "body: not a JSON object") and
featurises those impressions from the stores instead, as it does for any
record it cannot read, so a service upgraded first costs join rate, never
correctness.

Every decoder checks ids, sizes and that the arrays have the widths the record
states, and raises :class:`~feature_store.errors.InvalidInput` naming the
field otherwise (the log dead-letters the record with that reason); whether
the widths fit the reader's schema is the reader's business (the record names
its schema hash).
"""

from __future__ import annotations

from feature_store.errors import InvalidInput
from feature_store.served.binary import VERSION, decode_binary, encode_binary
from feature_store.served.json_v2 import decode_served_json
from feature_store.served.record import ServedArm, ServedItem, ServedItems, ServedRecord

__all__ = [
    "FORMAT_VERSION",
    "ServedArm",
    "ServedItem",
    "ServedItems",
    "ServedRecord",
    "decode_served",
    "encode_served",
]

FORMAT_VERSION = VERSION
"""The version every record is written in."""

_BINARY = bytes([VERSION])


def encode_served(record: ServedRecord) -> bytes:
    """``record`` as written to the served log (the binary format, version 3)."""
    return encode_binary(record)


def decode_served(value: bytes, max_id_length: int) -> ServedRecord:
    """The record in ``value``, of any version; :class:`InvalidInput` naming the field
    when it is not one."""
    first = value[:1]
    if first == _BINARY:
        return decode_binary(value, max_id_length)
    if first == b"{":
        return decode_served_json(value, max_id_length)
    raise InvalidInput("v", f"unknown format: first byte {first!r} (3: binary, '{{': JSON)")
