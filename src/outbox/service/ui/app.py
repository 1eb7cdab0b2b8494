"""The operator console: ``outbox ui``'s aiohttp application, composed of its
access rules, its operations, the JSON API and the HTML pages, served under
an ingress path prefix when it has one (docs/operators/console.md).

``/healthz`` needs no credentials (the probes'); ``/metrics`` exposes
``outbox_ui_actions_total``. Errors are JSON ``{"error": ...}`` under
``/api/``, a page elsewhere; nothing else of a failure leaks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from outbox.errors import NotFound, NotPermitted, OutboxError, StoreUnavailable
from outbox.service.ui import inputs
from outbox.service.ui.access import Access, Denied
from outbox.service.ui.api import MAX_BODY, Api
from outbox.service.ui.charts import CHARTS, Charts
from outbox.service.ui.inputs import Refused
from outbox.service.ui.operations import Operations
from outbox.service.ui.pages import Pages
from outbox.service.ui.tokens import TokenFile
from outbox.store import Store

__all__ = ["Console"]

log = logging.getLogger("outbox.ui")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

READ_ONLY = (
    "the console's database role may not do this (a read-only console: give it the "
    "operator grants, `outbox migrate --grants operator=ROLE`)"
)


class Console:
    """The console over ``store``. ``tokens`` None and no ``access``: no
    authentication (loopback only, every visitor a viewer)."""

    def __init__(
        self,
        store: Store[Any],
        tokens: TokenFile | None = None,
        *,
        access: Access | None = None,
        base: str = "",
        prometheus_url: str | None = None,
        trace_url: str | None = None,
    ) -> None:
        self.store = store
        self.access = access or Access(tokens)
        self.registry = CollectorRegistry()
        self.operations = Operations(store, self.registry)
        self.base = base
        self.charts = None if prometheus_url is None else Charts(prometheus_url)
        self.api = Api(store, self.operations, self.access)
        self.pages = Pages(
            store,
            self.operations,
            self.access,
            base=base,
            trace_url=trace_url,
            charts=self.charts is not None,
        )

    @property
    def actions(self) -> Any:
        return self.operations.actions

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._answers])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/charts/{name}.svg", self._chart)
        static = resources.files("outbox.service.ui") / "static"
        app.router.add_static("/static", str(static), append_version=False)
        self.api.routes(app.router)
        self.pages.routes(app.router)
        if not self.base:
            return app
        root = web.Application(client_max_size=MAX_BODY)
        root.add_subapp(self.base, app)
        root.router.add_get("/healthz", self._healthz)
        return root

    @web.middleware
    async def _answers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Errors with their status: JSON for the API, a page for the pages."""
        api = request.path.startswith(f"{self.base}/api/")
        try:
            return await handler(request)
        except (Refused, Denied) as exc:
            return await self._error(request, api, exc.status, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return await self._error(request, api, 413, f"the body is larger than {MAX_BODY} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return await self._error(request, api, exc.status, exc.reason)
            raise
        except NotFound as exc:
            return await self._error(request, api, 404, str(exc).removeprefix("outbox: "))
        except NotPermitted as exc:
            return await self._error(request, api, 403, f"{READ_ONLY}: {exc}")
        except StoreUnavailable as exc:
            return await self._error(request, api, 503, str(exc).removeprefix("outbox: "))
        except OutboxError as exc:
            log.warning("console request failed: %s", exc)
            return await self._error(request, api, 500, "the store failed; see the console's log")

    async def _error(
        self, request: web.Request, api: bool, status: int, message: str
    ) -> web.Response:
        if api:
            return web.json_response({"error": message}, status=status)
        try:
            return await self.pages.error(request, status, message)
        except OutboxError:  # the store is what failed: a page without its buttons
            return web.Response(status=status, text=f"{status}: {message}\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})

    async def _chart(self, request: web.Request) -> web.Response:
        if self.access.visitor(request) is None:
            raise Denied(401, "sign in first")
        name = request.match_info["name"]
        if name not in CHARTS or self.charts is None:
            raise Refused(404, "no such chart (is OUTBOX_UI_PROMETHEUS_URL set?)")
        topic = request.query.get("topic") or None
        if topic is not None:
            inputs.topic(topic)
        svg = await self.charts.svg(name, topic)
        return web.Response(
            text=svg,
            content_type="image/svg+xml",
            headers={"Cache-Control": "private, max-age=30", "X-Content-Type-Options": "nosniff"},
        )
