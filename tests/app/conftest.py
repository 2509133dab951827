"""Fixtures of the service tests: settings, an exported model, a running app."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # starlette nudges towards httpx2; the httpx-based client still works.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from app.main import create_app
from feature_store.features.schema import FeatureSchema
from feature_store.models.registry import ModelRegistry
from feature_store.settings import Settings

KEY = {"X-API-Key": "vidrec-dev-key"}
"""Headers carrying the development write/admin key."""


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Embedded (memory) settings with fast model polling, small warm-up buckets and a
    recommend deadline far above any scoring."""
    api = {
        "model_poll_interval_s": 0.05,
        "batch_buckets": (16, 128, 512),
        "fallback_refresh_s": 0.2,
        # Tests assert what is answered, not how fast: on a loaded machine a scoring can
        # outlast the 250 ms default and be answered from the popular list instead
        # (tests/app/test_overload.py sets its own deadlines).
        "recommend_deadline_ms": 30_000,
    }
    api.update(overrides.pop("api", {}))
    return Settings(data_dir=data_dir, api=api, **overrides)


def publish_model(
    registry: ModelRegistry,
    schema: FeatureSchema,
    *,
    family: str = "main",
    seed: int = 0,
    activate: bool = True,
) -> str:
    """A real exported WideDeep version (untrained), published like the trainer does."""
    import torch

    from trainer.export import publish
    from trainer.model import WideDeep

    torch.manual_seed(seed)
    time.sleep(0.002)  # version names carry milliseconds
    return publish(
        registry,
        WideDeep(schema, hidden=(32, 16)),
        schema,
        family=family,
        training_position={},
        metrics={},
        activate=activate,
        keep=20,
    )


def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path / "data")


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    """A running embedded app (memory backends), no model yet."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def service_of(client: TestClient) -> Any:
    return client.app.state.service  # type: ignore[attr-defined]


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free port (real sockets); yields its base URL."""
    import threading

    import uvicorn

    from tests.services import free_port

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        # Generous: `vidrec up --demo` seeds its world and warms a model before it listens,
        # which took over 60 s at load 12 on 2 cores.
        wait_for(lambda: server.started or not thread.is_alive(), timeout_s=240)
        if not server.started:
            raise RuntimeError("the app failed to start (see the log)")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
