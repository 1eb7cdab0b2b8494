"""What tracing costs the drain: one relay with and without a span per delivery.

Each round fills a fresh schema with ``--messages`` messages added inside an
OpenTelemetry span (so each carries a ``traceparent``), then drains them with
one relay (``Relay.run()``, batch 100, a no-op handler) twice, alternately: with
no tracer, and with a DeliveryTracer on the real SDK (a BatchSpanProcessor and
an exporter that drops what it is given, so the figure is the relay's cost, not
a collector's). Reported: messages per second and the relay process's CPU per
message (``time.process_time()`` over the drain), and traced over untraced.

    python bench/tracing.py [--database-url URL] [--messages 20000] [--rounds 3]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keys import TOPIC, stored


def _sdk() -> Any:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return provider


async def drain(url: str, n: int, provider: Any, traced: bool) -> tuple[float, float]:
    """(messages per second, CPU µs per message) of one drain."""
    from prometheus_client import CollectorRegistry

    from outbox import Message, Relay, RelayConfig
    from outbox.tracing import DeliveryTracer

    with provider.get_tracer("bench").start_as_current_span("produce"):
        keys: list[str | None] = [None] * n
        async with stored(url, keys, pool_size=4) as store:
            done = anyio.Event()
            seen = 0

            async def noop(m: Message) -> None:
                nonlocal seen
                seen += 1
                if seen == n:
                    done.set()

            relay = Relay(
                store,
                {TOPIC: noop},
                RelayConfig.model_validate({"batch": 100}),
                registry=CollectorRegistry(),
                listen=False,
                backlog=None,
                tracer=DeliveryTracer(provider) if traced else None,
            )
            started, cpu = time.perf_counter(), time.process_time()
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run)
                await done.wait()
                took, spent = time.perf_counter() - started, time.process_time() - cpu
                relay.stop()
    return n / took, spent / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "OUTBOX_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    provider = _sdk()
    print("| round | untraced msg/s | traced msg/s | traced / untraced | CPU µs/msg off | on |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in range(args.rounds):
        off, off_cpu = anyio.run(drain, args.database_url, args.messages, provider, False)
        on, on_cpu = anyio.run(drain, args.database_url, args.messages, provider, True)
        print(
            f"| {r + 1} | {off:,.0f} | {on:,.0f} | {on / off:.2f}x"
            f" | {off_cpu:.0f} | {on_cpu:.0f} |",
            flush=True,
        )
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
