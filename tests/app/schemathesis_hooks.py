"""Schemathesis hooks for ``test_schemathesis.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Two facts of the API that JSON Schema cannot say, told to the generator and
to the checks, and nothing else:

- An event's ``ts`` and a video's ``uploaded_at`` may be at most
  ``limits.future_tolerance_ms`` ahead of the receiver's clock. :func:`map_body`
  moves a generated time that lies in the future into the past, so that a
  schema-valid item stays valid when it arrives (a time that is invalid by
  the schema is left as generated).
- A batch write keeps its valid items and reports the rest (200 when one was
  kept). A batch with an invalid item is schema-violating, so the
  ``negative_data_rejection`` check expects a 4xx; :func:`filter_failure`
  drops that failure only when the answer rejected exactly the items that
  break the ``Event`` / ``Video`` schema, by index.
"""

from __future__ import annotations

import time
from typing import Any

import schemathesis
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from schemathesis.core.failures import AcceptedNegativeData

BATCHES = {("POST", "/v1/events"): ("events", "Event"), ("PUT", "/v1/videos"): ("videos", "Video")}
"""Batch writes: the body's list and the component of its items."""


TIMES = {("POST", "/v1/events"): ("events", "ts"), ("PUT", "/v1/videos"): ("videos", "uploaded_at")}
"""Batch writes whose items carry a time that may not lie in the future: (list, field)."""


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    operation = context.operation
    if operation is None:
        return body
    found = TIMES.get((operation.method.upper(), operation.path))
    if found is None:
        return body
    field, name = found
    items = body.get(field) if isinstance(body, dict) else None
    now = int(time.time() * 1000)
    for item in items if isinstance(items, list) else []:
        ts = item.get(name) if isinstance(item, dict) else None
        # An integer by the schema (5.0 too) that lies in the future.
        if isinstance(ts, int | float) and not isinstance(ts, bool) and ts == int(ts) > now:
            item[name] = now - int(ts) % 10**9  # 0 to 11.6 days ago
    return body


def _invalid_items(case: Any, field: str, component: str) -> set[int] | None:
    body = case.body
    items = body.get(field) if isinstance(body, dict) else None
    if not isinstance(items, list):
        return None
    document = case.operation.schema.raw_schema
    registry = Registry().with_resource(
        "urn:vidrec-openapi", DRAFT202012.create_resource(document)
    )
    validator = Draft202012Validator(
        {"$ref": f"urn:vidrec-openapi#/components/schemas/{component}"}, registry=registry
    )
    return {i for i, item in enumerate(items) if not validator.is_valid(item)}


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except a partial batch answered as documented."""
    batch = BATCHES.get((case.operation.method.upper(), case.operation.path))
    if batch is None or not isinstance(failure, AcceptedNegativeData):
        return True
    if response.status_code != 200:
        return True
    invalid = _invalid_items(case, *batch)
    answer = response.json()
    rejected = {error["index"] for error in answer.get("errors", [])}
    return not (invalid and invalid == rejected)
