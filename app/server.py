"""Running the service: ``vidrec up`` (everything in one process) and ``vidrec serve``.

``run_embedded`` is the README's run command: the API, the online trainer
(handed in as an extension by the composition root, ``app.wiring``, so this
module never imports ``trainer`` or torch itself), the event log, the sparse
tables, the stores and the signals all in one process, state snapshotted under
``data_dir`` on shutdown so a restart keeps what was learned. The backends
follow the settings: with ``VIDREC_EVENT_LOG__BACKEND=kafka`` and Redis
backends it uses Kafka and Redis instead. ``--demo`` adds :mod:`app.demo`'s
simulated users.

``run_service`` is the HTTP service alone (production: ``vidrec train`` runs
the trainer elsewhere). uvicorn handles SIGINT/SIGTERM by finishing
in-flight requests and running the lifespan's shutdown, which stops the
trainer gracefully and closes every client.

**Several workers on one port** (``vidrec serve --workers N``): a process
scores one request at a time on its scoring thread (:mod:`app.admission`)
and holds the GIL while it does, so one process uses about one core. With
``N`` workers uvicorn's supervisor binds the port once and starts ``N``
processes (``spawn``) that accept on it; each builds its own service from
the same ``VIDREC_*`` settings (:func:`worker_app`). They share state the
way separate replicas do: through Redis (stores, sparse tables, signals,
feedback, control) and Kafka (events, the served log), so several workers
are refused with any in-process backend (:func:`check_shared`). Each keeps
its own caches, model copy and ``/metrics`` (``/readyz`` names the process
that answered).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from collections.abc import Sequence

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.supervisors import Multiprocess

from app.main import Extension, create_app
from app.service import TrainerOpener
from feature_store.errors import ConfigurationError
from feature_store.runtime import tracing
from feature_store.settings import Settings

log = logging.getLogger(__name__)


class FreezeAfterStartup:
    """ASGI wrapper: once the lifespan's start-up is complete, collect and ``gc.freeze()``.

    What start-up built (the catalog, the stores and tables of the in-process
    backends, the model, the caches: most of a process's objects) lives as
    long as the process. Left in the collector's oldest generation, every full
    collection walks all of it, holding the GIL: 95-270 ms each at the
    overload benchmark's size (~300,000 objects, timed at load 5-8 on 2
    cores), a stall of the event loop,
    liveness and refusals included (docs/benchmarks.md, *Overload*). Frozen,
    a full collection walks only what was made since. Only the server runs
    it: a test process opens many apps, and each would pay a full collection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                gc.collect()
                gc.freeze()
            await send(message)

        await self.app(scope, receive, sending)


def _serve(app: ASGIApp, host: str, port: int, switch_interval_ms: float) -> int:
    # The loop hands scoring to a thread and waits for the GIL at each wake-up: a shorter
    # switch interval keeps it, liveness and refusals responsive (api.switch_interval_ms).
    sys.setswitchinterval(switch_interval_ms / 1000)
    config = uvicorn.Config(
        FreezeAfterStartup(app),
        host=host,
        port=port,
        log_config=None,  # keep the CLI's logging setup
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    uvicorn.Server(config).run()
    return 0


def run_embedded(
    settings: Settings,
    host: str,
    port: int,
    extensions: Sequence[Extension],
    trainer: TrainerOpener | None = None,
    demo: bool = False,
) -> int:
    """API + ``trainer`` + ``extensions`` (the composition root's, the demo) in one process.

    Runs until SIGINT/SIGTERM; ``demo`` only names the mode in the log line.
    """
    log.info(
        "vidrec up on http://%s:%d (docs at /docs), data in %s%s",
        host,
        port,
        settings.data_dir,
        ", demo traffic on" if demo else "",
    )
    with tracing.configured(settings.tracing, "embedded"):
        app = create_app(settings, trainer=trainer, extensions=list(extensions))
        return _serve(app, host, port, settings.api.switch_interval_ms)


def run_service(settings: Settings, host: str, port: int, workers: int = 1) -> int:
    """The HTTP service alone, in ``workers`` processes on the one port."""
    if workers > 1:
        return _serve_workers(settings, host, port, workers)
    with tracing.configured(settings.tracing, "api"):
        return _serve(create_app(settings), host, port, settings.api.switch_interval_ms)


_WORKER_DATA_DIR = "VIDREC_DATA_DIR"
_WORKER_LOG_LEVEL = "_VIDREC_WORKER_LOG_LEVEL"
"""The parent's log level, for the workers (spawned: they start with no logging set up)."""


def check_shared(settings: Settings) -> None:
    """Refuse several workers unless every piece of state they must share lives outside
    the process: each worker would otherwise have its own stores, tables and event log,
    and write the same snapshot and log files."""
    private = [
        name
        for name, backend, shared in (
            ("stores.backend", settings.stores.backend, "redis"),
            ("sparse.backend", settings.sparse.backend, "redis"),
            ("event_log.backend", settings.event_log.backend, "kafka"),
        )
        if backend != shared
    ]
    if private:
        raise ConfigurationError(
            f"--workers: several workers share state through Redis and Kafka only; "
            f"{', '.join(private)} keep it in the process (set them to redis / kafka, or "
            "run one worker)"
        )


def _serve_workers(settings: Settings, host: str, port: int, workers: int) -> int:
    """uvicorn's supervisor: binds the port, starts ``workers`` processes accepting on it,
    restarts one that dies, and on SIGINT/SIGTERM stops them all gracefully."""
    check_shared(settings)
    # The workers rebuild the settings from the environment: the parent's, plus what the
    # command line set. (Settings are not sent whole: secrets do not serialize.)
    os.environ[_WORKER_DATA_DIR] = str(settings.data_dir)
    os.environ[_WORKER_LOG_LEVEL] = logging.getLevelName(logging.getLogger().level)
    config = uvicorn.Config(
        "app.server:worker_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    log.info("vidrec serve on http://%s:%d with %d workers", host, port, workers)
    Multiprocess(config, sockets=[config.bind_socket()]).run()
    return 0


def worker_app() -> object:
    """One worker's application (uvicorn's factory, run in each spawned worker): the
    settings from ``VIDREC_*``, as the parent had them, and its own service."""
    logging.basicConfig(
        level=os.environ.get(_WORKER_LOG_LEVEL, "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = Settings()
    sys.setswitchinterval(settings.api.switch_interval_ms / 1000)
    if tracing.configure(settings.tracing, "api"):
        atexit.register(tracing.shutdown)  # the worker's lifetime: flushed when it exits
    return FreezeAfterStartup(create_app(settings))
