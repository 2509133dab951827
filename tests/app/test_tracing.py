"""Tracing: one event's trace from ``POST /v1/events`` to the trainer's batch, and nothing when off.

Spans go to OpenTelemetry's in-memory exporter (``tracing.configure`` with an
exporter); the service and the real trainer run embedded, over the in-process
log and over Kafka (Tansu), whose record headers carry the context.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from app.wiring import embedded_trainer
from feature_store.runtime import tracing
from feature_store.settings import Settings
from tests.app.conftest import KEY, TestClient, make_settings, publish_model, service_of, wait_for
from tests.app.test_families import VIDEOS
from tests.services import TansuBroker

pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra is not installed")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind  # noqa: E402

pytestmark = pytest.mark.slow
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = {"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"}


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(Settings().tracing, "test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def backend_settings(request: pytest.FixtureRequest, data_dir: Path) -> Settings:
    trainer = {"export_every_s": 0, "max_wait_ms": 50, "batch_size": 64}
    if request.param == "memory":
        return make_settings(data_dir, trainer=trainer)
    broker: TansuBroker = request.getfixturevalue("kafka_broker")
    return make_settings(
        data_dir, trainer=trainer,
        event_log={"backend": "kafka", "topic_namespace": f"tr{uuid.uuid4().hex[:8]}"},
        kafka={"bootstrap_servers": broker.bootstrap, "partitions": 2,
               "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return backend_settings(request, tmp_path / "data")


def named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_one_event_has_one_trace_from_the_request_to_the_trainer_batch(
    spans: InMemorySpanExporter, settings: Settings
) -> None:
    app = create_app(settings, trainer=embedded_trainer)
    with TestClient(app) as client:
        event = {"event_id": "traced-1", "user_id": "u1", "video_id": "v1", "type": "finish",
                 "watch_ms": 60_000, "duration_ms": 60_000, "ts": int(time.time() * 1000)}
        response = client.post("/v1/events", json={"events": [event]}, headers=KEY)
        while response.status_code == 503:  # not connected to the broker yet: resend
            time.sleep(float(response.headers.get("Retry-After", "1")))
            response = client.post("/v1/events", json={"events": [event]}, headers=KEY)
        assert response.json()["accepted"] == 1
        # The accepted request's span (a 503 before it has a trace of its own).
        server: Any = [s for s in named(spans, "POST /v1/events") if s.kind is SpanKind.SERVER][-1]
        trace_id = server.context.trace_id

        def batch() -> Any:
            found = [s for s in named(spans, "trainer.batch") if s.context.trace_id == trace_id]
            return found[0] if found else None

        trained = wait_for(batch, timeout_s=60)
    publish: Any
    (publish,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER
                  and s.context.trace_id == trace_id]
    assert publish.name.startswith("publish ") and publish.name.endswith(".events.v1")
    assert publish.parent.span_id == server.context.span_id
    assert trained.kind is SpanKind.CONSUMER
    assert trained.parent.span_id == publish.context.span_id  # through the record's headers
    assert trained.start_time >= publish.end_time - 1_000_000  # trained after it was produced


def test_recommend_stages_are_spans_of_the_callers_trace(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    with TestClient(create_app(make_settings(tmp_path / "data"))) as client:
        service = service_of(client)
        service.resources.catalog.upsert(VIDEOS)
        live = publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None and service.model.version == live)
        body = {"user_id": "u1", "candidates": [v.video_id for v in VIDEOS]}
        assert client.post("/v1/recommend", json=body, headers=CALLER).status_code == 200
    traced: list[Any] = [s for s in spans.get_finished_spans()
              if format(s.context.trace_id, "032x") == CALLER_TRACE]
    (server,) = [s for s in traced if s.name == "POST /v1/recommend"]
    stages = {s.name: s for s in traced if s.name.startswith("recommend.")}
    assert sorted(stages) == [f"recommend.{n}" for n in ("candidates", "features", "onnx", "pull")]
    for span in stages.values():
        assert span.parent.span_id == server.context.span_id
        assert server.start_time <= span.start_time <= span.end_time <= server.end_time
    # The scorer's three stages follow each other.
    assert stages["recommend.features"].end_time == stages["recommend.pull"].start_time
    assert stages["recommend.pull"].end_time == stages["recommend.onnx"].start_time


def test_off_imports_no_sdk_and_makes_no_span(tmp_path: Path) -> None:
    code = f"""
import sys, time
from fastapi.testclient import TestClient
from app.main import create_app
from feature_store.settings import Settings
from feature_store.runtime import tracing
with TestClient(create_app(Settings(data_dir={str(tmp_path / 'd')!r}))) as client:
    client.post("/v1/events", headers={KEY!r}, json={{"events": [{{"event_id": "e", "user_id":
        "u", "video_id": "v", "type": "play", "watch_ms": 5, "ts": int(time.time() * 1000)}}]}})
    client.post("/v1/recommend", json={{"user_id": "u"}})
assert not tracing.enabled()
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace",
                                                  "opentelemetry.exporter"))]
assert not loaded, loaded
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=120)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]
