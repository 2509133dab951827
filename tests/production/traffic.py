"""Client traffic of the production-topology tests and benchmarks.

:class:`Plays` posts plays at a steady rate (the scaling and exporter tests).

:class:`NamingClient` asks for recommendations at ``recommend_per_s`` and,
for every response a model ranked, reports what it showed as a client
would: an impression of each of the top ``shown`` items carrying the
response's ``recommendation_id``, and a play of the first. Events are posted
in batches ``posts_per_s`` times a second (a batch answered 503 is resent
after its ``Retry-After``). Used by ``tests/production/test_served_join.py``
and ``bench/bench_served_join.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.production.stack import KEY


@dataclass
class NamingClient:
    url: str
    recommend_per_s: float = 20.0
    posts_per_s: float = 5.0
    users: int = 200
    shown: int = 5
    ranked: int = 0
    """Responses a model ranked (an unknown user's fallback too): the service logged them,
    so the impressions naming them are the ones a join can find."""
    unranked: int = 0
    named: int = 0
    """Impressions posted and acknowledged that name a model-ranked response."""
    acked: list[str] = field(default_factory=list)
    """Ids of every event acknowledged, in order."""
    errors: list[str] = field(default_factory=list)
    _pending: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> NamingClient:
        for target in (self._recommend, self._post):
            thread = threading.Thread(target=self._guard, args=(target,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop asking; post what is pending; wait for both threads."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as exc:  # surfaced by the caller, not lost in a thread
            self.errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")

    def _paced(self, per_s: float) -> Iterator[int]:
        every, next_at, n = 1.0 / per_s, time.monotonic(), 0
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            next_at = max(next_at + every, time.monotonic() - 1.0)  # no burst after a stall
            yield n
            n += 1

    def _recommend(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for n in self._paced(self.recommend_per_s):
                user = f"pu{n % self.users}"
                try:
                    response = client.post("/v1/recommend", json={"user_id": user, "count": 10})
                except httpx.HTTPError as exc:
                    self.errors.append(f"recommend: {exc!r}")
                    continue
                if response.status_code != 200:
                    self.errors.append(f"recommend: {response.status_code} {response.text[:200]}")
                    continue
                body = response.json()
                if body["model_version"] is None or not body["items"]:
                    self.unranked += 1  # no model scored it: nothing was logged
                    continue
                self.ranked += 1
                with self._lock:
                    self._pending += self._reactions(user, body)

    def _reactions(self, user: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        rec = body["recommendation_id"]
        events: list[dict[str, Any]] = [
            {"event_id": f"imp-{uuid.uuid4().hex[:12]}", "user_id": user,
             "video_id": item["video_id"], "type": "impression", "ts": now + k,
             "recommendation_id": rec, "context": {"position": k, "surface": "home"}}
            for k, item in enumerate(body["items"][: self.shown])
        ]
        events.append({"event_id": f"play-{uuid.uuid4().hex[:12]}", "user_id": user,
                       "video_id": body["items"][0]["video_id"], "type": "play",
                       "watch_ms": 40_000, "duration_ms": 60_000, "ts": now + 50,
                       "recommendation_id": rec})
        return events

    def _post(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for _ in self._paced(self.posts_per_s):
                self._flush(client)
            self._flush(client)  # what the last recommends left

    def _flush(self, client: httpx.Client) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        if not events:
            return
        while True:
            try:
                response = client.post("/v1/events", json={"events": events}, headers=KEY)
            except httpx.HTTPError as exc:
                self.errors.append(f"post: {exc!r}")
                time.sleep(1.0)
                continue
            if response.status_code == 200:
                self.named += sum(1 for e in events if e["type"] == "impression")
                self.acked += [e["event_id"] for e in events]
                return
            if response.status_code != 503:
                self.errors.append(f"post: {response.status_code} {response.text[:200]}")
                return
            time.sleep(float(response.headers.get("Retry-After", "1")))


class Plays:
    """Posts ``per_s`` batches of plays (``batch`` users each) until stopped."""

    def __init__(self, url: str, videos: list[str], per_s: float = 5, batch: int = 20) -> None:
        self.url, self.videos, self.per_s, self.batch = url, videos, per_s, batch
        self.acked: list[tuple[str, str]] = []
        """(event id, video id) of every acknowledged play."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Plays:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self._stop.wait(1.0 / self.per_s):
                now = int(time.time() * 1000)
                events = [
                    {"event_id": f"s{n}-{i}", "user_id": f"su{(n * self.batch + i) % 97}",
                     "video_id": self.videos[(n + i * 3) % len(self.videos)], "type": "play",
                     "watch_ms": 30_000, "duration_ms": 60_000, "ts": now}
                    for i in range(self.batch)
                ]
                n += 1
                while not self._stop.is_set():
                    try:
                        r = client.post("/v1/events", json={"events": events}, headers=KEY)
                    except httpx.HTTPError as exc:
                        self.errors.append(repr(exc))
                        continue
                    if r.status_code == 200:
                        self.acked += [(e["event_id"], e["video_id"]) for e in events]
                        break
                    time.sleep(float(r.headers.get("Retry-After", "1")))
