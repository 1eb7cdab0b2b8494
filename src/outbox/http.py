"""The relay's HTTP endpoints: /metrics, /healthz and /readyz.

A few routes for probes and scrapes need no web framework: this is a minimal
HTTP/1.1 server on anyio that answers GET and HEAD and closes each connection.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

__all__ = ["ProbeServer"]

log = logging.getLogger("outbox.http")

_MAX_HEAD = 8192
_READ_TIMEOUT = 5.0


class ProbeServer:
    """Serves /metrics from ``registry``, /healthz from ``alive`` and /readyz from ``ready``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        alive: Callable[[], bool],
        ready: Callable[[], Awaitable[bool]],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.alive = alive
        self.ready = ready
        self.registry = REGISTRY if registry is None else registry

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; report the bound port through ``task_status``."""
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        async with listener:
            port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
            task_status.started(port)
            await listener.serve(self._connection)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(_READ_TIMEOUT):
                    head = await BufferedByteReceiveStream(stream).receive_until(
                        b"\r\n\r\n", _MAX_HEAD
                    )
                method, path = _request_line(head)
                status, ctype, body = await self._route(method, path)
                await stream.send(_response(status, ctype, b"" if method == "HEAD" else body))
            except (TimeoutError, anyio.IncompleteRead, anyio.DelimiterNotFound, ValueError):
                await _try_send(stream, _response(400, "text/plain", b"bad request\n"))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        path = path.split("?", 1)[0]
        if path == "/metrics":
            # The classic text format (0.0.4): every Prometheus 2.x scrapes it.
            return 200, CONTENT_TYPE_PLAIN_0_0_4, generate_latest(self.registry)
        if path == "/healthz":
            if self.alive():
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", b"relay loop has not reported in time\n"
        if path == "/readyz":
            if await self.ready():
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", b"not ready\n"
        return 404, "text/plain", b"not found\n"


def _request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    method, path, version = line.split(" ")
    if not version.startswith("HTTP/"):
        raise ValueError(line)
    return method, path


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(status: int, ctype: str, body: bytes) -> bytes:
    reason = _REASONS.get(status, "Service Unavailable")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def _try_send(stream: anyio.abc.SocketStream, data: bytes) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(data)
