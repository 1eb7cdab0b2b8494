"""The probe server over real sockets on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from prometheus_client import CollectorRegistry, Counter

from outbox.http import ProbeServer


class Probes:
    def __init__(self) -> None:
        self.alive = True
        self.ready = True


async def request(port: int, raw: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(raw)
        chunks = []
        try:
            while True:
                chunks.append(await stream.receive())
        except anyio.EndOfStream:
            pass
        return b"".join(chunks)


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Probes]]:
    probes = Probes()
    registry = CollectorRegistry()
    Counter("outbox_delivered", "d", ["topic"], registry=registry).labels("mail").inc()

    async def ready() -> bool:
        return probes.ready

    server = ProbeServer("127.0.0.1", 0, alive=lambda: probes.alive, ready=ready, registry=registry)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        yield port, probes
        tg.cancel_scope.cancel()


async def test_metrics_in_prometheus_text_format(served: tuple[int, Probes]) -> None:
    port, _ = served

    answer = await request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in answer
    assert b'outbox_delivered_total{topic="mail"} 1.0' in answer


async def test_probes_follow_their_checks(served: tuple[int, Probes]) -> None:
    port, probes = served

    assert (await request(port, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert (await request(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")
    probes.alive = probes.ready = False
    assert (await request(port, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503")
    assert (await request(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /elsewhere HTTP/1.1\r\n\r\n", b"404"),
        (b"nonsense\r\n\r\n", b"400"),
    ],
)
async def test_odd_requests_get_plain_errors(
    served: tuple[int, Probes], raw: bytes, status: bytes
) -> None:
    port, _ = served

    assert (await request(port, raw)).startswith(b"HTTP/1.1 " + status)


async def test_head_has_headers_only(served: tuple[int, Probes]) -> None:
    port, _ = served

    answer = await request(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 200")
    assert answer.endswith(b"\r\n\r\n")
