"""Every error vidrec raises on purpose, in one hierarchy.

    VidrecError                      base; knows its HTTP status
    ├── InvalidInput (422)           a value broke the contract; names the field
    ├── PayloadTooLarge (413)        a body or batch over its size limit
    ├── NotFound (404)               an id that does not exist
    ├── Unauthorized (401)           missing or wrong API key
    ├── Forbidden (403)              a valid key whose role may not do this
    ├── Conflict (409)               a state change that cannot apply now
    ├── TooManyRequests (429)        a bounded queue is full; retry later
    ├── ConfigurationError (500)     settings that cannot work
    ├── Overloaded (503)             shed: at a concurrency limit or past a deadline
    └── BackendUnavailable (503)     Redis or Kafka unreachable or failing
        ├── SparseTableUnavailable   the sparse table's backend failed
        ├── EventLogUnavailable      the event log's backend failed
        └── StoreUnavailable         the catalog or activity store failed

Third-party errors (redis-py, kafka-python) are translated at the backend
boundary and raised ``from`` the original, so callers catch only these.
"""

from __future__ import annotations


class VidrecError(Exception):
    """Base of vidrec's errors; ``http_status`` is what the API answers with."""

    http_status: int = 500

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        """Seconds a client should wait before retrying (the API's ``Retry-After``)."""

    def to_dict(self) -> dict[str, object]:
        """JSON body the API returns for this error."""
        return {"error": type(self).__name__, "message": self.message}


class InvalidInput(VidrecError):
    """A value broke the data contract; ``field`` names it (dotted path)."""

    http_status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message

    def to_dict(self) -> dict[str, object]:
        return {"error": type(self).__name__, "field": self.field, "message": self.reason}


class PayloadTooLarge(VidrecError):
    """A body or batch exceeds its documented size limit."""

    http_status = 413


class NotFound(VidrecError):
    """An id (video, model version, user) that does not exist."""

    http_status = 404


class Unauthorized(VidrecError):
    """Missing or wrong API key."""

    http_status = 401


class Forbidden(VidrecError):
    """A valid key whose role may not do this (the dashboard's viewer key acting)."""

    http_status = 403


class Conflict(VidrecError):
    """A state change that cannot apply now (e.g. promoting a missing version)."""

    http_status = 409


class TooManyRequests(VidrecError):
    """A bounded queue (pending admin actions) is full; retry after ``retry_after_s``."""

    http_status = 429


class ConfigurationError(VidrecError):
    """Settings that cannot work; raised at start, never mid-request."""

    http_status = 500


class Overloaded(VidrecError):
    """Shed by the API: a concurrency limit was reached, or the request's deadline passed
    before it could be served; nothing was done, retry after ``retry_after_s``."""

    http_status = 503


class BackendUnavailable(VidrecError):
    """An external backend (Redis, Kafka) is unreachable or failing."""

    http_status = 503


class SparseTableUnavailable(BackendUnavailable):
    """The sparse table's backend failed; the batch was not applied."""


class EventLogUnavailable(BackendUnavailable):
    """The event log's backend failed; produced records may not be durable."""


class StoreUnavailable(BackendUnavailable):
    """The catalog or activity store's backend failed."""
