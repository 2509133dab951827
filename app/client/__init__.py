"""A Python client of vidrec's HTTP API, sync and async, in the package itself.

    from app.client import Client, AsyncClient, Retry

One copy of the logic (:mod:`app.client.operations` on
:mod:`app.client.protocol`: requests, retries with the same event ids,
batching, parsing into the service's own response models) and two thin
drivers of it (:mod:`app.client.sync`, :mod:`app.client.aio`). It imports
neither the service nor torch (an import contract in ``pyproject.toml``).
See docs/api.md.
"""

from app.client.aio import AsyncClient
from app.client.base import ClientOptions
from app.client.errors import ApiError, ClientError, Unreachable
from app.client.operations import RecommendOptions, RecommendQuery
from app.client.protocol import Retry
from app.client.sync import Client

__all__ = [
    "ApiError", "AsyncClient", "Client", "ClientError", "ClientOptions", "RecommendOptions",
    "RecommendQuery", "Retry", "Unreachable",
]
