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
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from app.main import Extension, create_app
from app.service import TrainerOpener
from feature_store.runtime import tracing
from feature_store.settings import Settings

log = logging.getLogger(__name__)


def _serve(app: object, host: str, port: int, switch_interval_ms: float) -> int:
    # The loop hands scoring to a thread and waits for the GIL at each wake-up: a shorter
    # switch interval keeps it, liveness and refusals responsive (api.switch_interval_ms).
    sys.setswitchinterval(switch_interval_ms / 1000)
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
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


def run_service(settings: Settings, host: str, port: int) -> int:
    """The HTTP service alone."""
    with tracing.configured(settings.tracing, "api"):
        return _serve(create_app(settings), host, port, settings.api.switch_interval_ms)
