"""OpenTelemetry: the producer's trace context in a message's headers, a span per delivery.

Nothing here is imported unless OpenTelemetry is in use. A producer that
traces (``opentelemetry.trace`` imported, a span active) stores the span's
W3C ``traceparent`` and ``tracestate`` in the message's headers
(:func:`trace_headers`, called by ``new_message``). A relay given a
:class:`DeliveryTracer` records one CONSUMER span per delivery, following the
OpenTelemetry messaging conventions: the producer's span is its parent on the
first attempt and a link on later ones (a retry is a new delivery of an old
request, not part of it). While the handler runs its span is the current one,
so the kinds send its context on (:func:`trace_headers` again), and the
receiver continues the same trace.

``outbox relay`` configures the SDK from the standard ``OTEL_*`` variables
(:func:`configure_from_env`); an application that runs a relay itself passes
``tracer=DeliveryTracer()`` and configures its SDK as it already does.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from outbox.message import Message

__all__ = [
    "DeliverySpan",
    "DeliveryTracer",
    "configure_from_env",
    "trace_headers",
    "tracing",
    "with_trace",
]

log = logging.getLogger("outbox.tracing")

_FIELDS = ("traceparent", "tracestate")
SYSTEM = "outbox"
"""``messaging.system`` of the relay's spans."""


def tracing() -> bool:
    """Whether this process uses OpenTelemetry at all (nothing is imported to tell)."""
    return "opentelemetry.trace" in sys.modules


def trace_headers() -> dict[str, str]:
    """The current span's ``traceparent`` and ``tracestate`` ({} without a valid span)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return {k: v for k, v in carrier.items() if k in _FIELDS}


def with_trace(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with the current span's context in place of the stored one.

    Without a span (no SDK in the relay) the producer's own context goes on
    unchanged, so the receiver still joins the producer's trace.
    """
    sent = dict(headers)
    current = trace_headers()
    if current:
        sent.pop("tracestate", None)
        sent.update(current)
    return sent


class DeliverySpan:
    """The span of one delivery; the relay ends it with the outcome."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make the span the current one while the handler runs."""
        from opentelemetry import trace

        with trace.use_span(self.span, end_on_exit=False, record_exception=False):
            yield

    def exemplar(self) -> dict[str, str] | None:
        """The exemplar labels of the delivery-duration histogram (None: not sampled)."""
        ctx = self.span.get_span_context()
        if not ctx.trace_flags.sampled:
            return None
        return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}

    def end(self, outcome: str, reason: str | None = None) -> None:
        """End the span: ``outcome`` is acked, dropped, retried, buried or interrupted."""
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("outbox.delivery.outcome", outcome)
        if reason is not None:
            # The reason the relay stores as last_error: no payload, no secrets.
            self.span.set_attribute("error.type", reason.split(":", 1)[0][:100])
            self.span.set_status(Status(StatusCode.ERROR, reason))
        self.span.end()


class DeliveryTracer:
    """Starts the relay's delivery spans on ``provider`` (None: the global one)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        try:
            version = importlib.metadata.version("outbox-relay")
        except importlib.metadata.PackageNotFoundError:
            version = None
        self._tracer = trace.get_tracer("outbox-relay", version, tracer_provider=provider)
        self._propagator = TraceContextTextMapPropagator()

    def start(self, m: Message) -> DeliverySpan:
        """A started span for the delivery of ``m`` (its attempt is ``m.attempts``)."""
        from opentelemetry import context, trace

        producer = None
        if "traceparent" in m.headers:
            found = trace.get_current_span(self._propagator.extract(m.headers)).get_span_context()
            producer = found if found.is_valid else None
        first = m.attempts <= 1
        span = self._tracer.start_span(
            f"process {m.topic}",
            # Never the relay's own context: each delivery is a trace of its
            # producer's, or a root of its own.
            context=(
                trace.set_span_in_context(trace.NonRecordingSpan(producer))
                if producer is not None and first
                else context.Context()
            ),
            kind=trace.SpanKind.CONSUMER,
            links=[trace.Link(producer)] if producer is not None and not first else (),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": m.topic,
                "messaging.message.id": str(m.id),
                "outbox.message.attempt": m.attempts,
            },
        )
        return DeliverySpan(span)


def configure_from_env() -> DeliveryTracer | None:
    """Set up the SDK from the standard ``OTEL_*`` variables for ``outbox relay``.

    Tracing is on when ``OTEL_TRACES_EXPORTER`` names exporters (``otlp``,
    ``console``, or any registered under ``opentelemetry_traces_exporter``) or
    an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set, and ``OTEL_SDK_DISABLED`` is
    not true. A tracer provider set already (``opentelemetry-instrument``) is
    used as it is. Returns None, having imported nothing, when tracing is off.
    """
    env = os.environ
    names = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or names == "none":
        return None
    if not names and not endpoint:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* tracing is set, but outbox-relay[otel] is not installed: no spans")
        return None
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "outbox-relay"}
        provider = TracerProvider(resource=Resource.create(attributes))
        for name in (n.strip() for n in (names or "otlp").split(",")):
            if name and name != "none":
                provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        trace.set_tracer_provider(provider)
    return DeliveryTracer()


def _exporter(name: str) -> Any:
    from outbox.errors import ConfigError

    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        name = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER",
            f"no installed span exporter is called {name} (outbox-relay[otel] brings "
            "otlp over HTTP and console)",
        )
    return next(iter(found)).load()()
