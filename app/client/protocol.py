"""The client's logic, written once for both the sync and the async client.

Every operation is a generator (sans-I/O): it *yields* what it needs done,
a :class:`Call` (send this HTTP request) or a :class:`Wait` (sleep this
long), and receives the :class:`httpx.Response` (or, thrown into it, the
transport's error). Its return value is the operation's result. The two
clients (:mod:`app.client.sync`, :mod:`app.client.aio`) only drive these
generators with their own I/O (``httpx.Client`` and ``time.sleep``, or
``httpx.AsyncClient`` and ``asyncio.sleep``), so retries, backoff, batching
and parsing exist in one copy.

Retries (:class:`Retry`) resend the *same* request: a batch of events keeps
its ``event_id`` s, which the service and the trainer treat as idempotency
keys, so a batch whose answer was lost is trained once however often it is
resent (docs/deploy.md, *Faults*).
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from app.client.errors import ApiError, Unreachable

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request to send."""

    method: str
    path: str
    json: Any = None


@dataclass(frozen=True)
class Wait:
    """Sleep this many seconds before the next step."""

    seconds: float


Step = Generator[Call | Wait, httpx.Response | None, T]
"""An operation: yields calls and waits, receives responses, returns its result."""

RETRIED_STATUSES = frozenset({429, 502, 503, 504})
"""Answers worth resending: rate limited, a backend or a proxy briefly away. The service
answers 503 with ``Retry-After`` while Redis or the event log is down."""


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a request is resent (transport errors and
    :data:`RETRIED_STATUSES`); exponential backoff with full jitter, and the
    service's ``Retry-After`` when it gives one (capped at ``max_backoff_s``)."""

    attempts: int = 5
    """Tries in all, the first included (1: never resend)."""
    backoff_s: float = 0.2
    """The first wait's upper bound, seconds; doubled after each try."""
    max_backoff_s: float = 10.0
    """No wait longer than this, seconds, ``Retry-After`` included."""
    jitter: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def wait_s(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds before try ``attempt + 1`` (``attempt`` counts from 1)."""
        if retry_after_s is not None:
            return min(self.max_backoff_s, retry_after_s)
        bound = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return self.jitter.uniform(0, bound)


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def api_error(response: httpx.Response) -> ApiError:
    """The service's error answer as :class:`ApiError` (its one error shape)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return ApiError(
        response.status_code, str(body.get("error", response.reason_phrase)),
        str(body.get("message", response.text[:200])), body.get("field"),
        _retry_after(response),
    )


def send(call: Call, retry: Retry, ok: frozenset[int] = frozenset({200})) -> Step[httpx.Response]:
    """``call``, resent per ``retry``; the first answer whose status is in ``ok``.

    Any other answer raises :class:`ApiError` (once retries are spent for the
    retried statuses); no answer at all raises :class:`Unreachable`.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            response = yield call
        except httpx.TransportError as exc:
            if attempt >= retry.attempts:
                raise Unreachable(f"{call.method} {call.path}: {exc!r}") from exc
            yield Wait(retry.wait_s(attempt, None))
            continue
        assert response is not None
        if response.status_code in ok:
            return response
        if response.status_code not in RETRIED_STATUSES or attempt >= retry.attempts:
            raise api_error(response)
        yield Wait(retry.wait_s(attempt, _retry_after(response)))
