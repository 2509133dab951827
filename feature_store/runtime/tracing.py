"""OpenTelemetry tracing: optional (``pip install -e ".[tracing]"``), off unless configured.

**Off** (no ``tracing.otlp_endpoint``, the default): vidrec imports no
OpenTelemetry module of its own and makes no span. Every helper here returns
at its first line (a module global is None), and the service passes
FastAPI's native telemetry explicit "off" flags (``app.main``), so the
request path allocates nothing for tracing.

**On** (:func:`configure`, called once per process by ``vidrec up``,
``vidrec serve`` and ``vidrec train``): one ``TracerProvider`` with
``service.name`` = ``<tracing.service_name>-<role>``, parent-based sampling
at ``tracing.sample_ratio``, spans batched off the request path and exported
over OTLP/HTTP. The spans, and how one trace crosses the event log:

- **HTTP**: a server span per request (FastAPI's native telemetry, handed
  :func:`provider`: ``app.main``), continuing a caller's W3C ``traceparent``;
- **recommend stages**: ``recommend.candidates``, ``.features``, ``.pull``,
  ``.onnx`` under the request's span, built from the stage timings the
  service measures anyway (:func:`stage_observer`): no timer of its own;
- **produce**: ``publish <topic>`` (kind PRODUCER) around each produce made
  inside a trace (an ingest request), its context written into every record's
  headers (``traceparent``): Kafka record headers, or beside the record in
  the in-process log (in memory only: a trace does not outlive the process);
- **consume**: ``trainer.batch`` (kind CONSUMER) per trained batch, and
  ``experiments.batch`` per batch of the experiment metrics feed
  (:func:`batch_span`): a child of the first record's context in the batch
  that carries one, with links to the other contexts (at most
  :data:`MAX_LINKS`). So the event of one ``POST /v1/events`` has one trace
  id from the request to the batch that trained it; a batch of many
  requests' events belongs to the first one's trace and links the rest.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from feature_store.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from feature_store.settings import TracingSettings

log = logging.getLogger(__name__)

MAX_LINKS = 32
"""Other traces a batch span links to (one per distinct producer context)."""
Headers = Sequence[tuple[str, bytes]]
"""Record headers as Kafka carries them: (name, value) pairs."""


class _Traced(Protocol):
    @property
    def headers(self) -> Headers | None: ...


class _NoSpan:
    """The shared no-op context manager handed out while tracing is off (no allocation)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


@dataclass
class _State:
    provider: TracerProvider
    tracer: Tracer


_state: _State | None = None


def enabled() -> bool:
    return _state is not None


def provider() -> TracerProvider | None:
    """The process's provider (FastAPI's native telemetry is handed it), None when off."""
    return _state.provider if _state is not None else None


def configure(
    settings: TracingSettings, role: str, exporter: SpanExporter | None = None
) -> bool:
    """Start tracing for this process if ``settings`` (or ``exporter``) asks; idempotent.

    ``exporter`` replaces OTLP (tests hand an in-memory one; its spans are
    exported synchronously). Returns whether tracing is on.
    """
    global _state
    if _state is not None:
        return True
    if exporter is None and settings.otlp_endpoint is None:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigurationError(
            "tracing.otlp_endpoint is set but OpenTelemetry is not installed: "
            'pip install -e ".[tracing]"'
        ) from exc
    tracer_provider = TracerProvider(
        resource=Resource.create({"service.name": f"{settings.service_name}-{role}"}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    if exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        otlp = OTLPSpanExporter(
            endpoint=settings.otlp_endpoint,
            headers={k: v.get_secret_value() for k, v in settings.headers.items()},
            timeout=settings.timeout_s,
        )
        tracer_provider.add_span_processor(BatchSpanProcessor(otlp))
    _state = _State(tracer_provider, tracer_provider.get_tracer("vidrec"))
    log.info("tracing on: %s (%s)", settings.otlp_endpoint or type(exporter).__name__, role)
    return True


def shutdown() -> None:
    """Export what is pending and turn tracing off."""
    global _state
    state, _state = _state, None
    if state is not None:
        state.provider.shutdown()


@contextmanager
def configured(settings: TracingSettings, role: str) -> Iterator[None]:
    """Tracing for the block (a process's lifetime): configured, then flushed and shut down."""
    started = configure(settings, role)
    try:
        yield
    finally:
        if started:
            shutdown()


def _recording() -> bool:
    from opentelemetry import trace

    return bool(trace.get_current_span().is_recording())


def producing(topic: str, count: int) -> AbstractContextManager[list[tuple[str, bytes]] | None]:
    """Around one produce: a PRODUCER span when inside a trace, yielding the headers that
    carry its context to the consumers (None when off or outside any trace)."""
    if _state is None:
        return NO_SPAN
    return _producing(_state.tracer, topic, count)


@contextmanager
def _producing(tracer: Tracer, topic: str, count: int) -> Iterator[list[tuple[str, bytes]] | None]:
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    if not _recording():  # a background write (the served log), not part of a request
        yield None
        return
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka", "messaging.destination.name": topic,
        "messaging.operation.type": "send", "messaging.batch.message_count": count,
    }
    with tracer.start_as_current_span(
        f"publish {topic}", kind=SpanKind.PRODUCER, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield [(name, value.encode()) for name, value in carrier.items()]


def batch_span(name: str, records: Sequence[_Traced]) -> AbstractContextManager[None]:
    """A CONSUMER span around the processing of ``records`` (see the module docstring)."""
    if _state is None:
        return NO_SPAN
    return _batch_span(_state.tracer, name, records)


@contextmanager
def _batch_span(tracer: Tracer, name: str, records: Sequence[_Traced]) -> Iterator[None]:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind

    parents: dict[int, Any] = {}
    for record in records:
        headers = record.headers
        if not headers:
            continue
        carrier = {k: v.decode(errors="replace") for k, v in headers}
        context = propagate.extract(carrier)
        span_context = trace.get_current_span(context).get_span_context()
        if span_context.is_valid and span_context.span_id not in parents:
            parents[span_context.span_id] = (context, span_context)
            if len(parents) > MAX_LINKS:
                break
    found = list(parents.values())
    parent = found[0][0] if found else None
    links = [Link(span_context) for _, span_context in found[1:]]
    with tracer.start_as_current_span(
        name, context=parent, kind=SpanKind.CONSUMER, links=links,
        attributes={"messaging.batch.message_count": len(records)},
    ):
        yield


Observe = Callable[[str, float], None]
_pending: contextvars.ContextVar[tuple[tuple[str, float], ...]] = contextvars.ContextVar(
    "vidrec_pending_stages", default=()
)
SCORING_STAGES = ("features", "pull", "onnx")
"""Stages the scorer reports together once scoring ends, in this order, back to back."""


def stage_observer(observe: Observe) -> Observe:
    """``observe`` (the latency histograms' callback), also making a span per recommend
    stage under the request's span when tracing is on; ``observe`` itself when off.

    A stage is reported when it ends with its duration (``candidates``), or,
    for the scorer's three, all at once when scoring ends: those are laid end
    to end, ending at the last report.
    """
    if _state is None:
        return observe
    tracer = _state.tracer

    def traced(stage: str, seconds: float) -> None:
        observe(stage, seconds)
        if stage == "total" or not _recording():
            return
        if stage not in SCORING_STAGES:
            _emit(tracer, [(stage, seconds)])
            return
        pending = (*_pending.get(), (stage, seconds))
        if stage == SCORING_STAGES[-1]:
            _pending.set(())
            _emit(tracer, list(pending))
        else:
            _pending.set(pending)

    return traced


def _emit(tracer: Tracer, stages: list[tuple[str, float]]) -> None:
    end = time.time_ns()
    for stage, seconds in reversed(stages):
        start = end - int(seconds * 1e9)
        span = tracer.start_span(f"recommend.{stage}", start_time=start)
        span.end(end_time=end)
        end = start
