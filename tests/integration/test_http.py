"""The probe server over real sockets on loopback, and a relay's under a crowd of connections."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry, Counter

from outbox.service.http import ProbeServer
from tests.integration.process import REPO, free_port, outbox_env, wait_until


class Probes:
    def __init__(self) -> None:
        self.alive = True
        self.ready = True


async def request(port: int, head: bytes) -> bytes:
    """Send ``head`` (a request line, then headers) and read the answer to the end."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(head + b"\r\nHost: probe\r\nConnection: close\r\n\r\n")
        chunks = []
        try:
            while True:
                chunks.append(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
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

    answer = await request(port, b"GET /metrics HTTP/1.1")

    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in answer
    assert b'outbox_delivered_total{topic="mail"} 1.0' in answer


async def test_probes_follow_their_checks(served: tuple[int, Probes]) -> None:
    port, probes = served

    assert (await request(port, b"GET /healthz HTTP/1.1")).startswith(b"HTTP/1.1 200")
    assert (await request(port, b"GET /readyz HTTP/1.1")).startswith(b"HTTP/1.1 200")
    probes.alive = probes.ready = False
    assert (await request(port, b"GET /healthz HTTP/1.1")).startswith(b"HTTP/1.1 503")
    assert (await request(port, b"GET /readyz HTTP/1.1")).startswith(b"HTTP/1.1 503")


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /metrics HTTP/1.1", b"405"),
        (b"GET /elsewhere HTTP/1.1", b"404"),
        (b"GET http://relay:9090/healthz HTTP/1.1", b"200"),  # absolute-form, as proxies send
        (b"GET /healthz?verbose=1 HTTP/1.1", b"200"),
        (b"nonsense", b"400"),
    ],
)
async def test_requests_get_the_answers_http_says(
    served: tuple[int, Probes], head: bytes, status: bytes
) -> None:
    port, _ = served

    answer = await request(port, head)

    assert answer.split(b" ", 2)[1] == status, answer[:200]


async def test_405_names_the_allowed_methods_and_head_has_headers_only(
    served: tuple[int, Probes],
) -> None:
    port, _ = served

    refused = await request(port, b"DELETE /healthz HTTP/1.1")
    head = await request(port, b"HEAD /healthz HTTP/1.1")

    assert refused.startswith(b"HTTP/1.1 405")
    assert b"Allow: GET,HEAD" in refused.replace(b", ", b",")
    assert head.startswith(b"HTTP/1.1 200")
    assert head.endswith(b"\r\n\r\n")


def test_a_crowd_of_idle_connections_beyond_the_file_limit_leaves_the_relay_running(
    tmp_path: Path,
) -> None:
    port = free_port()
    limit = 64

    def low_file_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    log = (tmp_path / "relay.log").open("w")
    relay = subprocess.Popen(
        [sys.executable, "-m", "outbox.service.cli", "relay"],
        env=outbox_env(
            OUTBOX_DATA_DIR=str(tmp_path / "data"),
            OUTBOX_LOG_TOPICS="demo.hello",
            OUTBOX_HTTP_HOST="127.0.0.1",
            OUTBOX_HTTP_PORT=str(port),
        ),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=low_file_limit,
    )
    crowd: list[socket.socket] = []
    try:
        wait_until("the relay to be ready", lambda: _status(port, "/readyz") == 200, 60)
        for _ in range(limit + 70):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            crowd.append(s)
        assert relay.poll() is None, "the relay died under the crowd"
        for s in crowd:
            s.close()
        crowd.clear()
        wait_until("/healthz to answer again", lambda: _status(port, "/healthz") == 200, 30)
        assert relay.poll() is None
    finally:
        for s in crowd:
            s.close()
        relay.terminate()
        relay.wait(30)
        log.close()


def _status(port: int, path: str) -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return int(s.recv(64).split(b" ")[1])
    except (OSError, ValueError, IndexError):
        return None
