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

import functools
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, TracerProvider

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

SYSTEM = "outbox"
"""``messaging.system`` of the relay's spans."""


def tracing() -> bool:
    """Whether this process uses OpenTelemetry at all (nothing is imported to tell)."""
    return "opentelemetry.trace" in sys.modules


def trace_headers() -> dict[str, str]:
    """The current span's ``traceparent`` and ``tracestate`` ({} without a valid span)."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    # W3C Trace Context, as its propagator writes it (formatted here: this runs
    # for every message added and every delivery sent on).
    found = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    if ctx.trace_state:
        found["tracestate"] = ctx.trace_state.to_header()
    return found


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

    __slots__ = ("_otel", "_root", "recording", "span")

    def __init__(self, span: Span, otel: _Otel, root: object) -> None:
        self.span = span
        self.recording = span.is_recording()
        self._otel = otel
        self._root = root

    def enter(self) -> object:
        """Make the span the current one (while the handler runs); returns the token
        :meth:`leave` takes.

        An unsampled span is made current too: what the handler starts or sends
        on carries the decision not to sample.
        """
        otel = self._otel
        return otel.context.attach(otel.trace.set_span_in_context(self.span, self._root))

    def leave(self, token: object) -> None:
        self._otel.context.detach(token)

    def exemplar(self) -> dict[str, str] | None:
        """The exemplar labels of the delivery-duration histogram (None: not sampled)."""
        if not self.recording:
            return None
        ctx = self.span.get_span_context()
        if not ctx.trace_flags.sampled:
            return None
        return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}

    def end(self, outcome: str, reason: str | None = None) -> None:
        """End the span: ``outcome`` is acked, dropped, retried, buried or interrupted."""
        if not self.recording:
            return  # nothing of it is kept
        if reason is None:
            self.span.set_attribute("outbox.delivery.outcome", outcome)
        else:
            # The reason the relay stores as last_error: no payload, no secrets.
            self.span.set_attributes(
                {"outbox.delivery.outcome": outcome, "error.type": reason.split(":", 1)[0][:100]}
            )
            self.span.set_status(self._otel.Status(self._otel.ERROR, reason))
        self.span.end()


class _Otel:
    """The OpenTelemetry names a delivery uses, imported once (this runs per message)."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags, TraceState

        self.context = context
        self.trace = trace
        self.Status = Status
        self.ERROR = StatusCode.ERROR
        self.SpanContext = SpanContext
        self.TraceFlags = TraceFlags
        self.TraceState = TraceState


@functools.cache
def _otel() -> _Otel:
    return _Otel()


class DeliveryTracer:
    """Starts the relay's delivery spans on ``provider`` (None: the global one)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        import importlib.metadata

        self._otel = otel = _otel()
        try:
            version = importlib.metadata.version("outbox-relay")
        except importlib.metadata.PackageNotFoundError:
            version = None
        self._tracer = otel.trace.get_tracer("outbox-relay", version, tracer_provider=provider)
        # Never the relay's own context: each delivery is a trace of its
        # producer's, or a root of its own.
        self._root = otel.context.Context()

    def start(self, m: Message) -> DeliverySpan:
        """A started span for the delivery of ``m`` (its attempt is ``m.attempts``).

        The sampler sees what the messaging conventions ask to be there at
        creation (system, operation, destination); the message's id and
        attempt are added only to a span that is kept.
        """
        trace = self._otel.trace
        producer = _producer(m.headers)
        first = m.attempts <= 1
        span = self._tracer.start_span(
            f"process {m.topic}",
            context=(
                trace.set_span_in_context(trace.NonRecordingSpan(producer), self._root)
                if producer is not None and first
                else self._root
            ),
            kind=trace.SpanKind.CONSUMER,
            links=[trace.Link(producer)] if producer is not None and not first else (),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": m.topic,
            },
        )
        found = DeliverySpan(span, self._otel, self._root)
        if found.recording:
            span.set_attributes(
                {"messaging.message.id": str(m.id), "outbox.message.attempt": m.attempts}
            )
        return found


# W3C Trace Context: version-traceid-parentid-flags; a future version may add
# fields after a dash, version 00 may not.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def _producer(headers: Mapping[str, str]) -> SpanContext | None:
    """The producer's span context from a W3C ``traceparent`` (None: none, or malformed).

    Parsed here rather than by the propagator: this runs for every delivery.
    """
    text = headers.get("traceparent")
    if text is None:
        return None
    found = _TRACEPARENT.fullmatch(text)
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (rest is not None and version == "00"):
        return None
    otel = _otel()
    state = headers.get("tracestate")
    context = otel.SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=otel.TraceFlags(int(flags, 16)),
        trace_state=None if state is None else otel.TraceState.from_header([state]),
    )
    return context if context.is_valid else None


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
    import importlib.metadata

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
