"""OpenTelemetry end to end, with the real SDK: from the producer's span, through the
relay's delivery span, to the trace context a real webhook receiver gets, and the
exemplar on /metrics."""

from __future__ import annotations

import http.server
import json
import re
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import anyio
import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.exposition import choose_encoder

from outbox import backoff, new_message
from outbox.errors import ConfigError
from outbox.memory import MemoryStore
from outbox.message import Message
from outbox.postgres import add_sync
from outbox.service.http import ProbeServer
from outbox.tracing import DeliveryTracer, _producer, configure_from_env
from tests.integration.hooks import SECRET, SECRET_ENV, Hooked, Receiver
from tests.integration.kinds import TOPIC
from tests.integration.process import RelayProcess, run_outbox, wait_until
from tests.relay import Harness
from tests.tools import require_service

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@pytest.fixture
def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """An SDK of this test's own (the global provider can be set only once)."""
    exported = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exported))
    return sdk, exported


@pytest.fixture
async def traced(
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> AsyncIterator[Hooked]:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    h = Hooked(MemoryStore(), receiver.url, tracer=DeliveryTracer(provider[0]))
    await h.bind()
    yield h
    await h.kinds.aclose()


def deliveries(exported: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans() if s.name == f"process {TOPIC}"]


def sent_context(headers: dict[str, str]) -> tuple[int, int]:
    """(trace id, parent span id) of the traceparent a receiver got."""
    match = TRACEPARENT.fullmatch({k.lower(): v for k, v in headers.items()}["traceparent"])
    assert match, headers
    return int(match[1], 16), int(match[2], 16)


async def test_the_delivery_is_the_producers_child_and_the_receiver_continues_it(
    traced: Hooked, receiver: Receiver, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    sdk, exported = provider
    with sdk.get_tracer("shop").start_as_current_span("place order") as producing:
        m = await traced.add()
    producer = producing.get_span_context()
    assert m.headers["traceparent"] == (
        f"00-{producer.trace_id:032x}-{producer.span_id:016x}-{producer.trace_flags:02x}"
    )

    assert await traced.relay.drain() == 1

    [delivery] = deliveries(exported)
    assert delivery.kind == SpanKind.CONSUMER
    assert delivery.parent is not None
    assert (delivery.parent.trace_id, delivery.parent.span_id) == (
        producer.trace_id,
        producer.span_id,
    )
    assert not delivery.links
    assert dict(delivery.attributes or {}) == {
        "messaging.system": "outbox",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": TOPIC,
        "messaging.message.id": str(m.id),
        "outbox.message.attempt": 1,
        "outbox.delivery.outcome": "acked",
    }
    [(headers, _)] = receiver.requests
    assert sent_context(headers) == (producer.trace_id, delivery.context.span_id)


async def test_a_retry_links_to_the_producer_instead_of_joining_its_trace(
    traced: Hooked, receiver: Receiver, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    sdk, exported = provider
    receiver.replies.append((503, {}))
    with sdk.get_tracer("shop").start_as_current_span("place order") as producing:
        await traced.add()
    producer = producing.get_span_context()

    assert await traced.relay.drain() == 1
    traced.now += backoff(1)
    assert await traced.relay.drain() == 1

    first, retry = deliveries(exported)
    assert first.parent is not None
    assert first.parent.span_id == producer.span_id
    assert first.attributes is not None
    assert first.attributes["outbox.delivery.outcome"] == "retried"
    assert first.status.status_code == StatusCode.ERROR
    assert "HTTP 503" in (first.status.description or "")
    assert retry.parent is None
    assert retry.context.trace_id != producer.trace_id
    [link] = retry.links
    assert (link.context.trace_id, link.context.span_id) == (producer.trace_id, producer.span_id)
    assert retry.attributes is not None
    assert retry.attributes["outbox.message.attempt"] == 2
    assert retry.attributes["outbox.delivery.outcome"] == "acked"
    assert [sent_context(h)[0] for h, _ in receiver.requests] == [
        producer.trace_id,
        retry.context.trace_id,
    ]


async def test_without_a_span_the_producers_context_goes_on_to_the_receiver(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    untraced = Hooked(MemoryStore(), receiver.url)  # no tracer: a relay without the SDK
    await untraced.bind()
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await untraced.add(headers={"traceparent": given})

    assert await untraced.relay.drain() == 1
    await untraced.kinds.aclose()

    [(headers, _)] = receiver.requests
    assert {k.lower(): v for k, v in headers.items()}["traceparent"] == given


async def test_an_unsampled_producers_delivery_keeps_nothing_and_passes_the_decision_on(
    traced: Hooked, receiver: Receiver, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    exported = provider[1]
    unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    await traced.add(headers={"traceparent": unsampled})

    assert await traced.relay.drain() == 1

    assert deliveries(exported) == []  # the parent-based sampler follows the producer
    [(headers, _)] = receiver.requests
    trace_id, parent = sent_context(headers)
    assert trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert parent != 0xB7AD6B7169203331  # the (unkept) delivery span's, as the SDK made it
    assert headers["traceparent"].endswith("-00")
    encode, _ = choose_encoder("application/openmetrics-text")
    scraped = encode(traced.registry).decode()
    assert f'outbox_delivery_duration_seconds_count{{topic="{TOPIC}"}} 1.0' in scraped
    assert " # {" not in scraped  # no exemplar without a kept span


async def test_spans_a_handler_starts_follow_the_deliverys_sampling_decision(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    sdk, exported = provider
    seen: list[bool] = []

    async def handler(m: Message) -> None:
        with sdk.get_tracer("app").start_as_current_span("inside") as inside:
            seen.append(inside.is_recording())

    h = Harness(MemoryStore(), {TOPIC: handler}, tracer=DeliveryTracer(sdk))
    for flags in ("00", "01"):
        await h.add_one(TOPIC, {}, headers={"traceparent": f"{GOOD[:-2]}{flags}"})
        assert await h.relay.drain() == 1

    assert seen == [False, True]
    inside, delivery = exported.get_finished_spans()
    assert inside.parent is not None
    assert inside.parent.span_id == delivery.context.span_id


async def test_the_duration_histogram_carries_the_trace_as_an_exemplar_in_openmetrics(
    traced: Hooked, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    await traced.add()
    assert await traced.relay.drain() == 1
    [delivery] = deliveries(provider[1])
    probes = ProbeServer("127.0.0.1", 0, alive=lambda: True, ready=_ready, registry=traced.registry)

    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        port = await tg.start(probes.serve)
        url = f"http://127.0.0.1:{port}/metrics"
        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        async with http.get(url, headers={"Accept": accept}) as r:
            openmetrics = await r.text()
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        async with http.get(url) as r:
            classic = await r.text()
        tg.cancel_scope.cancel()

    trace_id = f"{delivery.context.trace_id:032x}"
    exemplars = re.findall(
        r"^outbox_delivery_duration_seconds_bucket\{.*\} 1\.0 # \{(.*?)\}", openmetrics, re.M
    )
    assert exemplars, openmetrics
    assert f'trace_id="{trace_id}"' in exemplars[0]
    assert trace_id not in classic  # the classic format has no exemplars


async def _ready() -> bool:
    return True


def test_an_unknown_exporter_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-of-my-own")
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        configure_from_env()


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
    ],
)
def test_without_otel_settings_the_relay_does_not_trace(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert configure_from_env() is None


class _Received(http.server.BaseHTTPRequestHandler):
    got: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, str]]]]:
    received: list[dict[str, str]] = []
    handler = type("Handler", (_Received,), {"got": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


def test_a_relay_process_continues_the_producers_trace_to_the_receiver(
    db: str,
    relays: list[RelayProcess],
    tmp_path: Path,
    hook: tuple[str, list[dict[str, str]]],
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    url, received = hook
    env = {"OUTBOX_DATABASE_URL": db, "OUTBOX_WEBHOOK_ALLOW": url}
    config = json.dumps({"url": url})
    tuned = run_outbox("topics", "set", TOPIC, "--handler", "webhook", "--config", config, **env)
    assert tuned.returncode == 0, tuned.stderr
    relay = RelayProcess(
        tmp_path,
        OUTBOX_INTERVAL="100ms",
        OTEL_TRACES_EXPORTER="console",
        OTEL_SERVICE_NAME="relay-under-test",
        **env,
    )
    relays.append(relay)
    relay.wait_ready()

    with provider[0].get_tracer("shop").start_as_current_span("place order") as producing:
        m = new_message(TOPIC, {"order": 1})
        with psycopg.connect(db) as conn, conn.transaction():
            add_sync(conn, m)
    producer = producing.get_span_context()
    wait_until("the delivery", lambda: bool(received))
    relay.signal(signal.SIGTERM)
    assert relay.wait(20) == 0

    [headers] = received
    trace_id, parent = sent_context(headers)
    assert trace_id == producer.trace_id
    [span] = [s for s in _console_spans(relay.log) if s["name"] == f"process {TOPIC}"]
    assert span["parent_id"] == f"0x{producer.span_id:016x}"
    assert span["context"]["span_id"] == f"0x{parent:016x}"
    assert span["attributes"]["messaging.message.id"] == str(m.id)
    assert span["resource"]["attributes"]["service.name"] == "relay-under-test"


def _console_spans(log: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed among the relay's JSON log lines."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := log.find("{\n", at)) != -1:
        span, at = decoder.raw_decode(log, at)
        spans.append(span)
    return spans


GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "traceparent",
    [
        "",
        GOOD[:-1],
        GOOD.upper(),
        GOOD + "-extra",  # version 00 is exactly 55 characters
        "ff" + GOOD[2:],
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        GOOD.replace("-", "_"),
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
    ],
)
def test_a_malformed_traceparent_is_no_parent(traceparent: str) -> None:
    assert _producer({"traceparent": traceparent}) is None


def test_a_traceparent_is_read_with_its_tracestate() -> None:
    found = _producer({"traceparent": GOOD, "tracestate": "vendor=abc,other=1"})

    assert found is not None
    assert (found.trace_id, found.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert found.trace_flags.sampled
    assert found.is_remote
    assert dict(found.trace_state) == {"vendor": "abc", "other": "1"}
    assert _producer({"traceparent": "01" + GOOD[2:] + "-future"}) is not None


async def test_the_redis_and_amqp_kinds_send_the_deliverys_context_on(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    import aio_pika
    import redis.asyncio

    from tests.integration import test_amqp, test_redis

    require_service("127.0.0.1", 6379, "Redis")
    require_service("127.0.0.1", 5672, "RabbitMQ")
    sdk, exported = provider
    name = f"outbox-test-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect_robust(test_amqp.URL)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT)
    queue = await channel.declare_queue(name, exclusive=True)
    await queue.bind(exchange)
    client = redis.asyncio.Redis.from_url(test_redis.CI_REDIS)
    try:
        appender = test_redis.Appender(
            MemoryStore(), test_redis.CI_REDIS, tracer=DeliveryTracer(sdk)
        )
        await appender.bind(name)
        publisher = test_amqp.Publisher(MemoryStore(), tracer=DeliveryTracer(sdk))
        await publisher.bind(name)
        with sdk.get_tracer("shop").start_as_current_span("place order") as producing:
            await appender.add()
            await publisher.add()
        assert await appender.relay.drain() == 1
        assert await publisher.relay.drain() == 1
        await appender.kinds.aclose()
        await publisher.kinds.aclose()
        [fields] = await test_redis.entries(test_redis.CI_REDIS, name)
        published = await queue.get(timeout=5)
        await published.ack()
    finally:
        await client.delete(name)
        await client.aclose()
        await channel.exchange_delete(name)
        await connection.close()

    producer = producing.get_span_context()
    by_span = {s.context.span_id: s for s in deliveries(exported)}
    for headers in (json.loads(fields["headers"]), dict(published.headers or {})):
        trace_id, parent = sent_context({k: str(v) for k, v in headers.items()})
        assert trace_id == producer.trace_id
        assert parent in by_span, "the context sent on is the delivery's span"
