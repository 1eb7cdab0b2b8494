"""The relay's (and the controller's) HTTP endpoints: /metrics, /healthz and /readyz, on aiohttp.

A crowd of idle or slow connections must never take the process down: aiohttp
keeps accept errors (out of file descriptors, say) inside the event loop's
listener, which pauses and retries, and idle keep-alive connections are closed
after a few seconds, so descriptors come back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["ProbeServer"]

log = logging.getLogger("outbox.service.http")

# Idle keep-alive connections are closed after this long: probes and scrapes
# reconnect cheaply, a crowd of idle clients gives its descriptors back.
_KEEPALIVE = 5.0
_READY_DEADLINE = 5.0


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

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)  # HEAD too
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; report the bound port through ``task_status``.

        A port already in use raises OSError before ``task_status`` is reported.
        """
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=_KEEPALIVE
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, backlog=128)
            await site.start()
            port = int(runner.addresses[0][1])
            task_status.started(port)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        # The classic text format (0.0.4), or OpenMetrics for a scraper that
        # asks for it (Prometheus does): only OpenMetrics carries exemplars,
        # the trace ids of the delivery-duration histogram.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.alive():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="relay loop has not reported in time\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = False
        with anyio.move_on_after(_READY_DEADLINE):
            ready = await self.ready()
        if ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready\n")
