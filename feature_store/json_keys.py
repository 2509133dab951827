"""JSON objects that name a key twice are refused, on HTTP and on the stream alike.

JSON parsers keep the last value of a repeated key (pydantic, ``json.loads``),
so ``{"user_id": "a", ..., "user_id": "b"}`` would be trained as ``b`` while
another reader of the same bytes (a proxy, a log shipper, a consumer in
another language) may have taken ``a``. Such input is ambiguous: the stream
dead-letters the record and HTTP answers 422, naming the key.

Cost: jiter (the parser inside pydantic-core, as a library) finds a repeated
key while parsing, about as long again as the parse itself. The hot paths
skip it when it cannot matter (:func:`repeated_keys` with ``distinct_keys``):
every key of a JSON object is followed by a ``:``, so a document whose bytes
hold no more ``:`` than the distinct keys its parser kept cannot repeat one
(ids may hold ``:``; such documents take the full check).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jiter
from pydantic import BaseModel

REPEATED_KEY = "key given twice (JSON parsers disagree on which value counts); send it once"
"""The message of a repeated key, on HTTP and in a dead letter."""

_JITER_DUPLICATE = re.compile(r'duplicate key "((?:[^"\\]|\\.)*)"')
_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types of parsed JSON values that hold no keys."""


def repeated_keys(raw: bytes, distinct_keys: int | None = None) -> list[str]:
    """Dotted paths of every repeated key in the JSON document ``raw`` (``events.3.ts``),
    in document order; empty when none, and when ``raw`` is not valid JSON (its parser
    says why). ``distinct_keys``: the keys the caller's parser kept, for the shortcut."""
    if distinct_keys is not None and raw.count(b":") <= distinct_keys:
        return []
    try:
        jiter.from_json(raw, catch_duplicate_keys=True, cache_mode="keys")
        return []
    except ValueError as exc:
        found = _JITER_DUPLICATE.search(str(exc))
        if found is None:  # not a repeated key: malformed JSON, reported by the caller
            return []
        key = found.group(1)
    try:
        paths = _paths(json.loads(raw, object_pairs_hook=_Object), "")
    except ValueError:  # jiter and json disagree on the document: name the key alone
        return [key]
    return paths or [key]


def keys_in(value: Any) -> int:
    """Keys the JSON objects in ``value`` held, as its parser kept them: a pydantic model's
    fields set (nested models and lists of them included), a dict's keys and theirs (the
    ``distinct_keys`` of :func:`repeated_keys`)."""
    if isinstance(value, BaseModel):
        fields = value.model_fields_set
        return len(fields) + sum(keys_in(getattr(value, name)) for name in fields)
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _SCALARS:  # a list of ids: no call per item
            return 0
        return sum(keys_in(item) for item in value)
    if isinstance(value, dict):
        return len(value) + sum(keys_in(item) for item in value.values())
    return 0


class _Object(dict[str, Any]):
    """A decoded JSON object that remembers which of its keys came more than once."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.repeated: list[str] = []
        for key, value in pairs:
            if key in self and key not in self.repeated:
                self.repeated.append(key)
            self[key] = value


def _paths(value: Any, prefix: str) -> list[str]:
    found: list[str] = []
    if isinstance(value, _Object):
        found += [prefix + key for key in value.repeated]
        for key, item in value.items():
            found += _paths(item, f"{prefix}{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, f"{prefix}{index}.")
    return found
