"""The fault scenarios' moving parts, shared by ``tests/faults`` and ``bench/bench_faults.py``.

Run as an operator would: a redis-server with AOF, a Tansu broker whose log
lives in an S3-compatible store of its own (so the broker can be SIGKILLed
and restarted with everything it acknowledged), ``vidrec serve`` and
``vidrec train`` as separate processes, and a client (:class:`Load`) that
keeps steady traffic going and records every answer: recommendations at a
fixed rate, event posts at a fixed rate (resending a batch after a 503's
``Retry-After``, as the API documents), and ``/healthz``.

The trainer runs with its audit on, so the ids it trained can be counted
against the ids the API acknowledged: none missing, none twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.services import RedisServer, S3Store, TansuBroker, free_port, wait_for_port

KEY = {"X-API-Key": "vidrec-dev-key"}
GROUP = "faults-trainer"
ROOT = Path(__file__).resolve().parents[2]


def stack_env(data_dir: Path, redis_url: str, bootstrap: str, namespace: str) -> dict[str, str]:
    """``VIDREC_*`` for both processes: Redis stores and tables, Kafka, quick timeouts."""
    return {
        "VIDREC_DATA_DIR": str(data_dir),
        "VIDREC_REDIS__URL": redis_url,
        "VIDREC_REDIS__SOCKET_TIMEOUT_S": "0.5",
        "VIDREC_SPARSE__BACKEND": "redis",
        "VIDREC_STORES__BACKEND": "redis",
        "VIDREC_EVENT_LOG__BACKEND": "kafka",
        "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": namespace,
        "VIDREC_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "VIDREC_KAFKA__PARTITIONS": "2",
        "VIDREC_KAFKA__SESSION_TIMEOUT_MS": "3000",
        "VIDREC_KAFKA__HEARTBEAT_INTERVAL_MS": "300",
        "VIDREC_KAFKA__MAX_POLL_INTERVAL_MS": "30000",
        "VIDREC_KAFKA__REQUEST_TIMEOUT_MS": "5000",
        "VIDREC_TRAINER__GROUP_ID": GROUP,
        "VIDREC_TRAINER__AUDIT": "true",
        "VIDREC_TRAINER__BATCH_SIZE": "256",
        "VIDREC_TRAINER__MAX_WAIT_MS": "50",
        "VIDREC_TRAINER__CHECKPOINT_EVERY_S": "1",
        "VIDREC_TRAINER__METRICS_EVERY_S": "0.5",
        "VIDREC_TRAINER__EXPORT_EVERY_S": "0",
        "VIDREC_TRAINER__THREADS": "1",
        "VIDREC_API__FALLBACK_REFRESH_S": "0.5",
        "VIDREC_API__MODEL_POLL_INTERVAL_S": "0.5",
        # Outages, not overload: on a loaded machine a scoring can outlast the 250 ms
        # default, and its deadline answer would read as an outage's degraded one.
        "VIDREC_API__RECOMMEND_DEADLINE_MS": "30000",
    }


def vidrec(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``vidrec ARGS`` as a subprocess of this checkout, its log appended to ``log``."""
    with open(log, "ab") as stderr:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "--log-level", "WARNING", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def stop(process: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def wait_until(predicate: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Stack:
    """Every process of one scenario; see the module docstring."""

    data_dir: Path
    redis: RedisServer
    s3: S3Store
    broker: TansuBroker
    env: dict[str, str]
    port: int
    serve: subprocess.Popen[bytes] | None = None
    train: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.data_dir.parent / "processes.log"

    def start_serve(self) -> None:
        self.serve = vidrec(
            ["serve", "--host", "127.0.0.1", "--port", str(self.port)], self.env, self.log
        )
        wait_for_port(self.port, 120, self.serve)

    def start_train(self) -> None:
        self.train = vidrec(["train"], self.env, self.log)

    def trainer_status(self) -> dict[str, Any]:
        try:
            import redis

            client = redis.Redis.from_url(self.redis.url, socket_timeout=1)
            raw = client.get(f"vidrec:v1:trainer:status:{GROUP}")
            client.close()
        except Exception:  # Redis may be the thing that is down
            return {}
        return dict(json.loads(raw)) if raw else {}

    def audited(self) -> Counter[str]:
        """Event ids the trainer trained, as its checkpoints' audit recorded them."""
        return Counter(read_audit(self.data_dir / "trainer" / GROUP / "audit"))

    def tail_log(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def read_audit(directory: Path) -> list[str]:
    """Ids in a trainer's audit segments; one the trainer removes meanwhile (a segment of a
    checkpoint that never became current, dropped at restart) is skipped."""
    ids: list[str] = []
    for path in sorted(directory.glob("*.ids")):
        try:
            ids += path.read_text().split()
        except FileNotFoundError:
            continue
    return ids


@contextmanager
def running_stack(tmp: Path, with_trainer: bool = True) -> Iterator[Stack]:
    """Redis (AOF), S3 store, durable Tansu, ``vidrec serve`` (and ``vidrec train``)."""
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(extra_args=("--appendonly", "yes")))
        s3 = stack.enter_context(S3Store())
        broker = stack.enter_context(TansuBroker(storage=s3))
        data_dir = tmp / "data"
        env = stack_env(data_dir, redis.url, broker.bootstrap, f"f{uuid.uuid4().hex[:8]}")
        services = Stack(data_dir, redis, s3, broker, env, free_port())
        try:
            services.start_serve()
            stack.callback(lambda: services.serve and stop(services.serve))
            if with_trainer:
                services.start_train()
                stack.callback(lambda: services.train and stop(services.train))
            yield services
        except BaseException:
            print(services.tail_log())
            raise


def start_embedded(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``vidrec up`` (API, trainer, in-process log and stores) on ``port``, once it listens."""
    env = {"VIDREC_DATA_DIR": str(data_dir), "VIDREC_TRAINER__EXPORT_EVERY_S": "0"}
    process = vidrec(["up", "--port", str(port)], env, log)
    wait_for_port(port, 120, process)
    return process


def seed_catalog(url: str, count: int = 60) -> list[str]:
    """``count`` videos, uploaded over the last hour (fresh candidates for everyone)."""
    now = int(time.time() * 1000)
    videos = [
        {
            "video_id": f"fv{i}", "creator_id": f"fc{i % 7}", "category": f"cat{i % 5}",
            "tags": ["t"], "duration_ms": 60_000, "uploaded_at": now - 60_000 * i,
        }
        for i in range(count)
    ]
    with httpx.Client(base_url=url, timeout=30) as client:
        response = client.put("/v1/videos", json={"videos": videos}, headers=KEY)
        assert response.status_code == 200, response.text
    return [v["video_id"] for v in videos]  # type: ignore[misc]


@dataclass
class Answer:
    at: float
    """``time.monotonic()`` when the request was sent."""
    seconds: float
    status: int
    degraded: bool = False


@dataclass
class Load:
    """Steady client traffic against ``url``; see the module docstring.

    ``recommend_per_s`` requests of ``POST /v1/recommend``, ``posts_per_s``
    batches of ``batch`` events each (a batch answered 503 is resent with
    the same ids after ``Retry-After``, as the API documents), ``/healthz``
    every ``health_every_s``. Stops after ``events_total`` events were
    acknowledged (if given) or on :meth:`stop`.
    """

    url: str
    recommend_per_s: float = 20.0
    posts_per_s: float = 5.0
    batch: int = 10
    health_every_s: float = 0.2
    events_total: int | None = None
    videos: list[str] = field(default_factory=list)
    recommends: list[Answer] = field(default_factory=list)
    posts: list[Answer] = field(default_factory=list)
    health: list[Answer] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    """Ids of events in batches answered 200, in order."""
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for target in (self._recommend, self._post, self._health):
            thread = threading.Thread(target=self._guard, args=(target,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    @property
    def done(self) -> bool:
        return self.events_total is not None and len(self.acked) >= self.events_total

    def _guard(self, target: Any) -> None:
        try:
            target()
        except Exception as exc:  # surfaced by the test, not lost in a thread
            self.errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")

    def _paced(self, per_s: float) -> Iterator[int]:
        every = 1.0 / per_s
        next_at = time.monotonic()
        n = 0
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
                body = {"user_id": f"fu{n % 50}", "count": 10}
                started = time.monotonic()
                try:
                    response = client.post("/v1/recommend", json=body)
                except httpx.HTTPError:
                    self.recommends.append(Answer(started, time.monotonic() - started, 0))
                    continue
                seconds = time.monotonic() - started
                degraded = response.status_code == 200 and bool(response.json().get("degraded"))
                self.recommends.append(Answer(started, seconds, response.status_code, degraded))

    def _events(self, n: int) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        videos = self.videos or ["fv0"]
        return [
            {
                "event_id": f"ev-{n}-{i}-{uuid.uuid4().hex[:6]}",
                "user_id": f"fu{(n * self.batch + i) % 50}",
                "video_id": videos[(n * 7 + i) % len(videos)],
                "type": "play", "watch_ms": 45_000, "duration_ms": 60_000, "ts": now,
            }
            for i in range(self.batch)
        ]

    def _post(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for n in self._paced(self.posts_per_s):
                if self.done:
                    return
                events = self._events(n)
                while not self._stop.is_set():
                    started = time.monotonic()
                    try:
                        response = client.post(
                            "/v1/events", json={"events": events}, headers=KEY
                        )
                    except httpx.HTTPError:
                        self.posts.append(Answer(started, time.monotonic() - started, 0))
                        self._stop.wait(1.0)
                        continue
                    self.posts.append(
                        Answer(started, time.monotonic() - started, response.status_code)
                    )
                    if response.status_code == 200:
                        self.acked.extend(e["event_id"] for e in events)
                        break
                    retry = float(response.headers.get("Retry-After", "1"))
                    self._stop.wait(retry)

    def _health(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for _ in self._paced(1.0 / self.health_every_s):
                started = time.monotonic()
                try:
                    status = client.get("/healthz").status_code
                except httpx.HTTPError:
                    status = 0
                self.health.append(Answer(started, time.monotonic() - started, status))


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
