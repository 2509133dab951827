"""Factors in Redis, shared by every trainer and serving process of a deployment.

Layout (one family's keys share the hash tag ``{model}``, so they sit in one Redis
Cluster slot and every read is one pipelined round trip):

- ``{prefix}version``: the newest fit's version (an integer);
- ``{prefix}items:{v}`` and ``{prefix}ids:{v}``: fit ``v``'s video factors (raw
  float32, row-major) and their ids (newline-separated), written once;
- ``{prefix}users:{v}``: a hash of each user's factor in fit ``v`` (raw float32).

A fit writes its keys first, then the version, then drops the fits before the
previous one (a request that read the previous version a moment ago still finds
it). The service keeps the newest fit's video factors in memory and asks Redis
only for the version and the user's row at each request, in the round trip of
the request's history read (:meth:`RedisFactors.read_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import numpy as np
from redis.cluster import RedisCluster

from feature_store.constants import factors_prefix
from feature_store.errors import StoreUnavailable
from feature_store.factors.base import ItemFactors, Vectors
from feature_store.redis_errors import redis_errors
from feature_store.sparse.resp import command_steps
from feature_store.sparse.steps import Steps, run

USERS_PER_COMMAND = 1000
"""Users per ``HSET`` when a fit is published (bounds one command's size)."""


def _errors(operation: str) -> AbstractContextManager[None]:
    return redis_errors(StoreUnavailable, f"factors {operation} failed")


class RedisFactors:
    """See the module doc; ``model``: the family (its sparse tables' ``model_name``)."""

    def __init__(self, client: Any, model: str) -> None:
        self.client = client
        self.prefix = factors_prefix(model)
        self._items: ItemFactors | None = None
        """The newest fit's video factors this process read (the service's cache)."""

    def _key(self, kind: str, version: int | None = None) -> str:
        return f"{self.prefix}{kind}" if version is None else f"{self.prefix}{kind}:{version}"

    def publish(self, ids: Sequence[str], vectors: Vectors, users: Sequence[str],
                user_vectors: Vectors) -> int:
        items = np.ascontiguousarray(vectors, np.float32)
        rows = np.ascontiguousarray(user_vectors, np.float32)
        with _errors("publish"):
            latest = self.client.get(self._key("version"))
            version = (int(latest) if latest is not None else 0) + 1
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self._key("items", version), items.tobytes())
            pipe.set(self._key("ids", version), "\n".join(ids))
            self._set_users(pipe, version, users, rows)
            pipe.set(self._key("version"), version)
            for old in range(max(1, version - 3), version - 1):
                pipe.unlink(self._key("items", old), self._key("ids", old),
                            self._key("users", old))
            pipe.execute()
        return version

    def fold(self, version: int, users: Sequence[str], user_vectors: Vectors) -> None:
        if not users:
            return
        rows = np.ascontiguousarray(user_vectors, np.float32)
        with _errors("fold"):
            latest = self.client.get(self._key("version"))
            if latest is None or int(latest) != version:
                return
            pipe = self.client.pipeline(transaction=False)
            self._set_users(pipe, version, users, rows)
            pipe.execute()

    def _set_users(self, pipe: Any, version: int, users: Sequence[str], rows: Vectors) -> None:
        """``HSET`` of fit ``version``'s rows of ``users``, :data:`USERS_PER_COMMAND` a
        command, into ``pipe``."""
        for start in range(0, len(users), USERS_PER_COMMAND):
            chunk = range(start, min(start + USERS_PER_COMMAND, len(users)))
            pipe.hset(self._key("users", version),
                      mapping={users[i]: rows[i].tobytes() for i in chunk})

    def read(self, user_id: str) -> tuple[ItemFactors | None, Vectors | None]:
        (got,) = run([self.read_steps(user_id)])
        return cast(tuple[ItemFactors | None, Vectors | None], got)

    def read_steps(self, user_id: str) -> Steps[tuple[ItemFactors | None, Vectors | None]]:
        """:meth:`read` as steps (:mod:`feature_store.sparse.steps`): the version and the
        user's row in the cached fit ride in the request's round trip with the other
        stores' reads; a new fit's video factors are loaded after it (once per fit)."""
        cached = self._items
        commands: list[tuple[Any, ...]] = [("GET", self._key("version"))]
        if cached is not None:
            commands.append(("HGET", self._key("users", cached.version), user_id))
        if isinstance(self.client, RedisCluster):
            with _errors("read"):
                pipe = self.client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                got = pipe.execute()
        else:
            got = yield from command_steps(self.client, commands, StoreUnavailable,
                                           "factors read failed")
        if got[0] is None:
            return None, None
        version = int(got[0])
        if cached is not None and cached.version == version:
            return cached, self._row(got[1], cached.dim)
        with _errors("read"):
            loaded = self._load(version, user_id)
        if loaded is None:
            return cached, None  # the fit was replaced while read: the next request loads
        self._items = loaded[0]
        return loaded

    def _load(self, version: int, user_id: str) -> tuple[ItemFactors, Vectors | None] | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self._key("items", version))
        pipe.get(self._key("ids", version))
        pipe.hget(self._key("users", version), user_id)
        blob, ids, row = pipe.execute()
        if blob is None or ids is None:
            return None
        names = tuple(ids.decode().split("\n")) if ids else ()
        vectors = np.frombuffer(blob, np.float32)
        if not names or len(vectors) % len(names):
            return None
        items = ItemFactors(version, names, vectors.reshape(len(names), -1))
        return items, self._row(row, items.dim)

    @staticmethod
    def _row(value: bytes | None, dim: int) -> Vectors | None:
        if value is None or len(value) != 4 * dim:
            return None
        return np.frombuffer(value, np.float32)

    def ping(self) -> None:
        with _errors("ping"):
            self.client.ping()

    def clear(self) -> None:
        with _errors("clear"):
            keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
            if keys:
                self.client.unlink(*keys)
        self._items = None

    def close(self) -> None:
        return None  # the client is the caller's
