"""The relay process: database, pool, relay loop, HTTP endpoints and signals.

Shutdown is graceful on the first SIGTERM or SIGINT: claiming stops at once,
handlers in flight finish within the handler timeout, what they could not
finish is released for another relay, the pool closes and the process exits
0. A second signal cancels everything at once (the batch in hand is still
handed back, within two seconds) and exits 130 or 143.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.durations import format_duration
from outbox.errors import ConfigError, OutboxError, first_line
from outbox.handlers import HandlerKinds
from outbox.postgres import PostgresStore, connect_pool, migrate, pending
from outbox.postgres.connection import connect
from outbox.postgres.queries import QUERIES
from outbox.relay import Handler, Relay
from outbox.relay.config import STORE_WAIT
from outbox.service.embedded import EmbeddedPostgres, NotInstalled
from outbox.service.http import ProbeServer
from outbox.service.logs import redact
from outbox.service.settings import (
    RelayConfig,
    ServiceSettings,
    kind_settings,
)
from outbox.tracing import DeliveryTracer

__all__ = ["ForcedExit", "StartupError", "database", "run_relay"]

log = logging.getLogger("outbox.service")

_CONNECT_TIMEOUT = 10


class StartupError(OutboxError):
    """The process cannot start: the database is unreachable or not migrated."""


class ForcedExit(OutboxError):
    """A second signal asked to exit at once."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"exiting at once on second {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


def pinned(url: str, schema: str | None) -> str:
    """``url`` with search_path pinned to ``schema`` alone (None: as it is)."""
    if schema is None:
        return url
    options = conninfo_to_dict(url).get("options") or ""
    return make_conninfo(url, options=f"{options} -c search_path={schema}".strip())


@asynccontextmanager
async def database(
    settings: ServiceSettings, *, migrate_embedded: bool = True
) -> AsyncIterator[str]:
    """Yield the conninfo to use: OUTBOX_DATABASE_URL, or an embedded server we start.

    The embedded server is migrated, announced in one log line and stopped on exit.
    """
    if settings.database_url is not None:
        url = settings.database_url.get_secret_value()
        await _check_reachable(url)
        if settings.database_schema is not None:
            url = pinned(url, settings.database_schema)
            await _check_schema(url, settings.database_schema)
        yield url
        return
    server = EmbeddedPostgres(settings.data_dir / "pgdata")
    try:
        url = await anyio.to_thread.run_sync(server.start)
    except NotInstalled as exc:
        raise StartupError(f"OUTBOX_DATABASE_URL: unset, and {exc}") from None
    except Exception as exc:
        raise StartupError(
            f"OUTBOX_DATA_DIR: cannot start embedded PostgreSQL in {server.data_dir}: {exc}"
        ) from exc
    try:
        if migrate_embedded:
            await migrate(url)
        log.info(
            "no OUTBOX_DATABASE_URL: using embedded PostgreSQL with data in %s", server.data_dir
        )
        yield url
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(server.stop)
        log.info("embedded PostgreSQL stopped")


async def _check_schema(url: str, schema: str) -> None:
    async with await connect(url, connect_timeout=_CONNECT_TIMEOUT) as c:
        cur = await c.execute(QUERIES["schema_current"])
        row = await cur.fetchone()
    if not row or row[0] != schema:
        raise ConfigError(
            "OUTBOX_DATABASE_SCHEMA",
            f"schema {schema} does not exist (or this role may not use it); create it "
            f"first: CREATE SCHEMA {schema} AUTHORIZATION <the role that runs migrate>",
        )


async def _check_reachable(url: str) -> None:
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        # libpq's own message quotes the string around the error, which may be
        # the tail of a password: say what is wrong without repeating any of it.
        raise ConfigError(
            "OUTBOX_DATABASE_URL",
            "not a valid libpq URL or conninfo string (in a URL, percent-encode special "
            "characters of the password: space %20, @ %40, % %25, / %2F; in key=value form, "
            "single-quote values with spaces)",
        ) from None
    if "@" in str(params.get("host") or ""):
        # An unencoded @ in a URL's password: the rest of the password became the host.
        raise ConfigError(
            "OUTBOX_DATABASE_URL",
            "the host part holds an '@': percent-encode @ in the user or password as %40",
        )
    try:
        conn = await connect(url, connect_timeout=_CONNECT_TIMEOUT)
    except psycopg.Error as exc:
        reason = redact(first_line(exc, typed=False))
        raise StartupError(f"OUTBOX_DATABASE_URL: cannot connect: {reason}") from None
    await conn.close()


async def _check_migrated(url: str) -> None:
    async with await connect(url, connect_timeout=_CONNECT_TIMEOUT) as c:
        missing = await pending(c)
    if missing:
        raise StartupError(
            f"OUTBOX_DATABASE_URL: schema lacks migrations {missing}: run `outbox migrate` first"
        )


async def run_relay(
    settings: ServiceSettings,
    config: RelayConfig,
    handlers: Mapping[str, Handler],
    checks: Sequence[Callable[[], bool]] = (),
    tracer: DeliveryTracer | None = None,
) -> None:
    """Run one relay process until a signal stops it.

    ``checks`` join readiness: each says whether a dependency (the SMTP server)
    currently takes this relay's deliveries. ``tracer`` records a span per
    delivery (outbox.tracing.configure_from_env).
    """
    async with anyio.create_task_group() as tg:
        shutdown = _Shutdown(tg.cancel_scope)
        tg.start_soon(shutdown.watch)
        try:
            async with database(settings) as url:
                await _check_migrated(url)
                await _serve(url, settings, config, handlers, shutdown, checks, tracer)
        finally:
            tg.cancel_scope.cancel()
    if shutdown.forced is not None:
        raise ForcedExit(shutdown.forced)


async def _serve(
    url: str,
    settings: ServiceSettings,
    config: RelayConfig,
    handlers: Mapping[str, Handler],
    shutdown: _Shutdown,
    checks: Sequence[Callable[[], bool]] = (),
    tracer: DeliveryTracer | None = None,
) -> None:
    # A short wait for a connection: during an outage every store call fails
    # within seconds (and says so), and SIGTERM is not held up by it.
    pool = connect_pool(
        url,
        min_size=1,
        max_size=settings.pool_size,
        prepare=settings.prepared_statements,
        timeout=STORE_WAIT,
    )
    async with pool:
        listen_url = settings.listen_url.get_secret_value() if settings.listen_url else None
        store = PostgresStore(pool, listen_url=listen_url)
        kinds = HandlerKinds(**kind_settings())
        relay = Relay(
            store,
            handlers,
            config,
            kinds=kinds.mapping,
            backlog=settings.backlog_interval,
            tracer=tracer,
            # The chart sets POD_NAME from the downward API: `outbox relays` shows it.
            host=os.environ.get("POD_NAME"),
        )
        shutdown.relay = relay

        async def ready() -> bool:
            if relay.stopping or relay.housekeeping_failing:
                return False
            if not all(check() for check in checks):
                return False
            with anyio.move_on_after(2):
                try:
                    async with pool.connection(timeout=2) as conn:
                        await conn.execute(QUERIES["store_ping"])
                    return True
                except Exception:
                    return False
            return False

        probes = ProbeServer(settings.http_host, settings.http_port, alive=relay.alive, ready=ready)
        async with anyio.create_task_group() as tg:
            try:
                port = await tg.start(probes.serve)
            except OSError as exc:
                raise StartupError(
                    f"OUTBOX_HTTP_PORT: cannot listen on {settings.http_host}:"
                    f"{settings.http_port}: {exc.strerror or exc}"
                ) from None
            log.info(
                "relay started: topics=%s batch=%d interval=%s http=%s:%d",
                ",".join(sorted(handlers)),
                config.batch,
                format_duration(config.interval),
                settings.http_host,
                port,
            )
            if shutdown.requested:
                relay.stop()
            try:
                await relay.run()
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await kinds.aclose()
    log.info("relay stopped; pool closed")


class _Shutdown:
    """First signal: stop the relay gracefully. Second: cancel everything."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        self.relay: Relay | None = None
        self.requested = False
        self.forced: int | None = None

    async def watch(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.requested:
                    log.warning("second %s: exiting at once", name)
                    self.forced = signum
                    self.scope.cancel()
                    return
                self.requested = True
                if self.relay is None:
                    log.info("%s before the relay started: exiting", name)
                    self.scope.cancel()
                    return
                log.info("%s: stopping; in-flight deliveries get up to the timeout", name)
                self.relay.stop()
