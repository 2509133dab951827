"""``TrainerComponent``: the trainer as the service and the CLI see it.

Built by the composition root (``app.wiring``), the one module of ``app``
that imports ``trainer``. ``start`` runs the loop in a daemon thread
(embedded mode, inside ``vidrec up``); ``run`` runs it in the caller's
thread (``vidrec train``, whose SIGTERM handler calls ``stop``).

``stop`` is graceful: the loop stops fetching, finishes the batch in hand
(push and dense step), writes a checkpoint and commits the offsets it
covers, then exits. Called from a signal handler on the loop's own thread it
only raises the flag (joining there would deadlock); ``run`` returns once
the final checkpoint is written.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from feature_store.ops.timeseries import MetricsSeries
from feature_store.runtime.resources import Resources
from feature_store.runtime.worker import Worker
from trainer.loop import OnlineTrainer

log = logging.getLogger(__name__)

class TrainerComponent:
    """A :class:`trainer.control.TrainerHandle` over :class:`OnlineTrainer`."""

    def __init__(
        self,
        resources: Resources,
        *,
        registry: CollectorRegistry | None = None,
        series: MetricsSeries | None = None,
    ) -> None:
        self.series = series if series is not None else resources.trainer_series
        """Where the loop writes its metrics and heartbeat: by default the resources'
        (the dashboard of the same process reads that one); the resources close it."""
        self.loop = OnlineTrainer(resources, registry=registry, series=self.series)
        self._worker = Worker("vidrec-trainer", lambda stop: self._run_thread())
        self._error: BaseException | None = None

    @property
    def metrics_registry(self) -> CollectorRegistry:
        """Prometheus registry holding the trainer's metrics."""
        return self.loop.metrics.registry

    def start(self) -> None:
        self._worker.start()

    def _run_thread(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:  # kept for status(); the service stays up
            self._error = exc
            self.loop.last_error = repr(exc)
            log.exception("trainer thread failed")

    def run(self) -> None:
        """Train in this thread; with ``trainer.metrics_port``, serve /metrics meanwhile."""
        cfg = self.loop.cfg
        server = None
        if cfg.metrics_port:
            server, _ = start_http_server(
                cfg.metrics_port, addr=cfg.metrics_host, registry=self.metrics_registry
            )
            log.info("trainer metrics on http://%s:%d/", cfg.metrics_host, cfg.metrics_port)
        try:
            self.loop.run()
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.loop.request_stop()  # the loop's own stop flag: it ends at a batch boundary
        self._worker.stop(timeout_s)
        if self._worker.alive and self._worker.thread is not threading.current_thread():
            log.warning("trainer did not stop within %.0f s", timeout_s)

    def status(self) -> dict[str, Any]:
        status = self.loop.status()
        status["paused"] = self.loop.paused
        if self._error is not None:
            status["state"] = "failed"
        return status

    def export_now(self, activate: bool = True) -> str:
        return self.loop.export_now(activate)

    def pause(self) -> None:
        self.loop.pause()

    def resume(self) -> None:
        self.loop.resume()

    def __enter__(self) -> TrainerComponent:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
