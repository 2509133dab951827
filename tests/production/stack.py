"""The production topology as an operator runs it, for ``tests/production`` and the benchmarks.

A redis-server and a Tansu broker on durable storage (the session's, see
``conftest.py``; a benchmark starts its own), ``vidrec serve`` and one or
more ``vidrec train`` processes, each trainer with its own data directory
(its checkpoints, journal and audit) and one registry shared by all, as
pods sharing a volume would. Every process reads its settings from
``VIDREC_*``, as in the deployment manifests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from feature_store.constants import TRAINER_STATUS
from tests.services import free_port, wait_for_port

KEY = {"X-API-Key": "vidrec-dev-key"}
GROUP = "prod-trainer"
ROOT = Path(__file__).resolve().parents[2]


def production_env(redis_url: str, bootstrap: str, **extra: str) -> dict[str, str]:
    """``VIDREC_*`` every process shares: Redis stores and tables, 8 partitions, quick
    group timeouts (a join or a takeover in seconds), a fresh topic namespace."""
    return {
        "VIDREC_REDIS__URL": redis_url,
        "VIDREC_REDIS__SOCKET_TIMEOUT_S": "2",
        "VIDREC_SPARSE__BACKEND": "redis",
        "VIDREC_STORES__BACKEND": "redis",
        "VIDREC_EVENT_LOG__BACKEND": "kafka",
        "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": f"p{uuid.uuid4().hex[:10]}",
        "VIDREC_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "VIDREC_KAFKA__PARTITIONS": "8",
        "VIDREC_KAFKA__SESSION_TIMEOUT_MS": "3000",
        "VIDREC_KAFKA__HEARTBEAT_INTERVAL_MS": "300",
        "VIDREC_KAFKA__MAX_POLL_INTERVAL_MS": "60000",
        "VIDREC_KAFKA__REQUEST_TIMEOUT_MS": "5000",
        "VIDREC_TRAINER__GROUP_ID": GROUP,
        "VIDREC_TRAINER__AUDIT": "true",
        "VIDREC_TRAINER__BATCH_SIZE": "256",
        "VIDREC_TRAINER__MAX_WAIT_MS": "50",
        "VIDREC_TRAINER__CHECKPOINT_EVERY_S": "1",
        "VIDREC_TRAINER__METRICS_EVERY_S": "0.5",
        "VIDREC_TRAINER__EXPORT_EVERY_S": "3",
        "VIDREC_TRAINER__THREADS": "1",
        "VIDREC_API__FALLBACK_REFRESH_S": "0.5",
        "VIDREC_API__MODEL_POLL_INTERVAL_S": "0.5",
        **extra,
    }


def vidrec(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``vidrec ARGS`` from this checkout, its output appended to ``log``."""
    with open(log, "ab") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "--log-level", "WARNING", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def wait_until(predicate: Any, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class TrainerProcess:
    """One ``vidrec train`` with its own data directory and ``/metrics`` port."""

    name: str
    data_dir: Path
    env: dict[str, str]
    log: Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def group_dir(self) -> Path:
        return self.data_dir / "trainer" / self.env["VIDREC_TRAINER__GROUP_ID"]

    def start(self) -> TrainerProcess:
        env = {**self.env, "VIDREC_DATA_DIR": str(self.data_dir),
               "VIDREC_TRAINER__METRICS_PORT": str(self.metrics_port)}
        self.process = vidrec(["train"], env, self.log)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM (a graceful stop: last batch, checkpoint, commit), SIGKILL past ``timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            process.terminate()
            try:
                return process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def kill(self) -> None:
        """SIGKILL: no last checkpoint, no commit."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(30)

    def metrics(self) -> str:
        """The trainer's Prometheus exposition ("" while it is not listening)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return ""

    # --- what it trained (its audit and journal, ``trainer.audit``) ---------------

    def latest_seq(self) -> int:
        try:
            return int(json.loads((self.group_dir / "LATEST").read_text())["seq"])
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    def trained(self) -> list[str]:
        """Event ids this trainer pushed: its current checkpoints' audit, then the batches
        journaled since (a torn last line was never finished)."""
        latest = self.latest_seq()
        ids: list[str] = []
        for path in sorted((self.group_dir / "audit").glob("*.ids")):
            if int(path.stem) <= latest:
                with suppress(FileNotFoundError):
                    ids += path.read_text().split()
        seen = set(ids)
        with suppress(FileNotFoundError):
            for line in (self.group_dir / "journal.jsonl").read_text().splitlines():
                try:
                    ids += [i for i in json.loads(line) if i not in seen]
                except json.JSONDecodeError:
                    break
        return ids


@dataclass
class Production:
    """``vidrec serve`` and any number of trainers over one Redis and one broker."""

    root: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    serve: subprocess.Popen[bytes] | None = None
    trainers: list[TrainerProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "processes.log"

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    def _data_dir(self, name: str) -> Path:
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        if not (directory / "registry").exists():
            (directory / "registry").symlink_to(self.registry, target_is_directory=True)
        return directory

    def start_serve(self) -> None:
        env = {**self.env, "VIDREC_DATA_DIR": str(self._data_dir("serve"))}
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        self.serve = vidrec(args, env, self.log)
        wait_for_port(self.port, 120, self.serve)

    def trainer(self, name: str, **env: str) -> TrainerProcess:
        """A trainer (not started) with its own data directory under ``root/name``."""
        trainer = TrainerProcess(name, self._data_dir(name), {**self.env, **env}, self.log)
        self.trainers.append(trainer)
        return trainer

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.env["VIDREC_REDIS__URL"], socket_timeout=5)

    def status(self, group: str = GROUP) -> dict[str, Any]:
        """The group's trainer heartbeat (the last trainer that wrote it), {} if none."""
        client = self.redis()
        try:
            raw = client.get(TRAINER_STATUS + group)
        finally:
            client.close()
        return dict(json.loads(raw)) if raw else {}

    def close(self) -> None:
        for trainer in self.trainers:
            trainer.stop(30)
        if self.serve is not None and self.serve.poll() is None:
            self.serve.terminate()
            try:
                self.serve.wait(30)
            except subprocess.TimeoutExpired:
                self.serve.kill()
                self.serve.wait()
        self.serve = None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def seed_catalog(url: str, count: int = 40) -> list[str]:
    """``count`` videos uploaded over the last hour."""
    now = int(time.time() * 1000)
    videos = [
        {"video_id": f"pv{i}", "creator_id": f"pc{i % 7}", "category": f"cat{i % 5}",
         "tags": ["t"], "duration_ms": 60_000, "uploaded_at": now - 60_000 * i}
        for i in range(count)
    ]
    with httpx.Client(base_url=url, timeout=30) as client:
        response = client.put("/v1/videos", json={"videos": videos}, headers=KEY)
        assert response.status_code == 200, response.text
    return [str(v["video_id"]) for v in videos]


def plays(users: int, videos: list[str], count: int, tag: str) -> list[dict[str, Any]]:
    """``count`` play events spread over ``users`` users (half long, half short)."""
    now = int(time.time() * 1000)
    return [
        {"event_id": f"{tag}-{i}", "user_id": f"pu{i % users}",
         "video_id": videos[(i * 7 + i // users) % len(videos)], "type": "play",
         "watch_ms": 50_000 if i % 2 else 3_000, "duration_ms": 60_000, "ts": now + i}
        for i in range(count)
    ]


def post(client: httpx.Client, events: list[dict[str, Any]], chunk: int = 200) -> None:
    """Post ``events``, resending a batch answered 503 after its ``Retry-After``."""
    for start in range(0, len(events), chunk):
        body = {"events": events[start : start + chunk]}
        while True:
            response = client.post("/v1/events", json=body, headers=KEY)
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            time.sleep(float(response.headers.get("Retry-After", "1")))


def counter_values(metrics_text: str, name: str) -> Counter[str]:
    """``{label value: count}`` of a one-label Prometheus counter in an exposition."""
    values: Counter[str] = Counter()
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            label = line.split('"')[1]
            values[label] += int(float(line.split()[-1]))
    return values
