"""What tracing costs the drain: one relay with and without a span per delivery.

Each round fills a fresh schema with ``--messages`` messages added inside an
OpenTelemetry span (so each carries a ``traceparent``), then drains them with
one relay (``Relay.run()``, batch 100, a no-op handler) twice, alternately: with
no tracer, and with a DeliveryTracer on the real SDK (a BatchSpanProcessor and
an exporter that drops what it is given, so the figure is the relay's cost, not
a collector's). Reported: messages per second and the relay process's CPU per
message (``time.process_time()`` over the drain), and traced over untraced,
beside what the SDK's span alone costs (started with a delivery's attributes and
ended, in a loop, same provider): the least a traced delivery can cost.

With ``--webhook``, the topic is bound to the webhook kind instead, posting
to a receiver in a process of its own on loopback (which answers 204): a
delivery that does I/O, where the kind also sends the delivery's
``traceparent``.

With ``--ratio 0.1``, producers and relay sample a tenth of the traces
(parent-based, as ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` sets).

    python -m bench tracing [--database-url URL] [--messages 20000] [--rounds 3] [--webhook]
        [--ratio 1.0]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from bench.keys import TOPIC, Counting, left, stored
from bench.server import arguments, listening


def _sdk(ratio: float, batch: bool = True) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # The SDK's default (parent-based, always on) at 1; else what a busy
    # deployment sets: OTEL_TRACES_SAMPLER=parentbased_traceidratio.
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    processor = BatchSpanProcessor if batch else SimpleSpanProcessor
    provider.add_span_processor(processor(Dropping()))
    return provider


RECEIVER = """
import sys
from aiohttp import web

async def hook(request):
    await request.read()
    return web.Response(status=204)

app = web.Application()
app.router.add_post("/hook", hook)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def drain(
    url: str, n: int, provider: Any, traced: bool, hook: str | None
) -> tuple[float, float]:
    """(messages per second, CPU µs per message) of one drain."""
    from prometheus_client import CollectorRegistry

    from outbox import Relay, RelayConfig
    from outbox.handlers import HandlerKinds
    from outbox.handlers.settings import WebhookSettings
    from outbox.store import TopicSettings
    from outbox.tracing import DeliveryTracer

    producer = provider.get_tracer("bench")
    keys: list[str | None] = [None] * n
    # One producer's trace a message, as each comes from a request of its own.
    async with stored(url, keys, 4, lambda: producer.start_as_current_span("produce")) as store:
        noop = Counting(n)
        kinds = HandlerKinds(webhook=WebhookSettings(allow=hook or ""))
        if hook:
            config = {"url": hook}
            await store.set_topic(TopicSettings(TOPIC, handler="webhook", config=config))
        relay = Relay(
            store,
            {} if hook else {TOPIC: noop},
            RelayConfig.model_validate({"batch": 100, "interval": "50ms"}),
            registry=CollectorRegistry(),
            kinds=kinds.mapping,
            listen=False,
            backlog=None,
            tracer=DeliveryTracer(provider) if traced else None,
        )
        started, cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            if hook:
                while await left(store):  # noqa: ASYNC110 (a table, not an event)
                    await anyio.sleep(0.01)
            else:
                await noop.done.wait()
            took, spent = time.perf_counter() - started, time.process_time() - cpu
            relay.stop()
        await kinds.aclose()
    return n / took, spent / n * 1e6


def floor(ratio: float, n: int) -> float:
    """CPU µs of the SDK's own span, alone: started with the attributes a delivery's
    span carries and ended (what no relay can spend less than per traced delivery),
    handed to an exporter that drops it in the same thread."""
    import uuid

    from opentelemetry.trace import SpanKind

    tracer = _sdk(ratio, batch=False).get_tracer("floor")
    cpu = time.process_time()
    for _ in range(n):
        span = tracer.start_span(
            f"process {TOPIC}",
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "outbox",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": TOPIC,
                "messaging.message.id": str(uuid.uuid4()),
                "outbox.message.attempt": 1,
                "outbox.delivery.outcome": "acked",
            },
        )
        span.end()
    return (time.process_time() - cpu) / n * 1e6


def main() -> int:
    parser = arguments(__doc__, rounds=3, local=True)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--webhook", action="store_true", help="deliver through the webhook kind")
    parser.add_argument(
        "--ratio", type=float, default=1.0, help="share of traces sampled (producers and relay)"
    )
    args = parser.parse_args()
    provider = _sdk(args.ratio)
    receiver = None
    hook = None
    if args.webhook:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
        hook = f"http://127.0.0.1:{port}/hook"
        listening(port)
    print(
        "| round | untraced msg/s | traced msg/s | traced / untraced | CPU µs/msg off | on"
        " | SDK span alone µs |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in range(args.rounds):
        off, off_cpu = anyio.run(drain, args.database_url, args.messages, provider, False, hook)
        on, on_cpu = anyio.run(drain, args.database_url, args.messages, provider, True, hook)
        alone = floor(args.ratio, args.messages)
        print(
            f"| {r + 1} | {off:,.0f} | {on:,.0f} | {on / off:.2f}x"
            f" | {off_cpu:.0f} | {on_cpu:.0f} | {alone:.0f} |",
            flush=True,
        )
    provider.shutdown()
    if receiver is not None:
        receiver.terminate()
        receiver.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
