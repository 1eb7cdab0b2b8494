"""A real HTTP receiver on loopback and a relay whose topic posts to it."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from aiohttp import web

from outbox import Store
from outbox.service.settings import WebhookSettings
from tests.integration.kinds import KindRelay

SECRET = "whsec_" + base64.b64encode(b"test-key-0123456789").decode()
SECRET_ENV = "OUTBOX_WEBHOOK_SECRET_TEST"


class Receiver:
    """An HTTP endpoint that answers with the statuses queued in ``replies``."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.replies: list[tuple[int, dict[str, str]]] = []
        self.stall = False
        self.released = anyio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((dict(request.headers), await request.read()))
        if self.stall:
            await self.released.wait()
        status, headers = self.replies.pop(0) if self.replies else (200, {})
        if headers.pop("X-Endless", None):
            # A body that never ends: a relay that read it would time out.
            endless = web.StreamResponse(status=status, headers=headers)
            await endless.prepare(request)
            while True:
                await endless.write(b"x" * 65536)
                await anyio.sleep(0.001)
        return web.Response(status=status, headers=headers, text=f"bad payload {request.path_qs}")


@asynccontextmanager
async def serving(r: Receiver, host: str = "127.0.0.1") -> AsyncIterator[Receiver]:
    """Serve ``r`` on a loopback port; ``r.url`` is its address."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r.url = f"http://{host}:{port}/hook"
    try:
        yield r
    finally:
        r.released.set()
        await runner.cleanup()


class Hooked(KindRelay):
    def __init__(self, store: Store[Any], url: str, **config: Any) -> None:
        allow = WebhookSettings(allow=url.rsplit("/", 1)[0] + "/hook")
        super().__init__(store, {"order": 42, "total": "9.99"}, webhook=allow, **config)
        self.url = url

    async def bind(self, **extra: Any) -> None:
        config = {"url": self.url, "secret_env": SECRET_ENV, **extra}
        await self.bind_kind("webhook", config)
