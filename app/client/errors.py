"""What the client raises::

    ClientError                 every error of this package
    ├── ApiError                the service answered with an error (4xx, 5xx after retries)
    └── Unreachable             no answer: connection refused, timed out (after retries)

Retries happen before either is raised (:class:`app.client.protocol.Retry`).
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of the client's errors."""


class ApiError(ClientError):
    """The service's error answer: its status and its one error shape."""

    def __init__(
        self, status: int, error: str, message: str, field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {field + ': ' if field else ''}{message}")
        self.status = status
        self.error = error
        """The error class (``InvalidInput``, ``PayloadTooLarge``, ``BackendUnavailable``...)."""
        self.message = message
        self.field = field
        """Dotted path of the offending input (``InvalidInput`` only): ``events.3.ts``."""
        self.retry_after_s = retry_after_s


class Unreachable(ClientError):
    """No answer from the service (raised from the transport's error)."""
