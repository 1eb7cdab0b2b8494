"""`outbox ui`: the operator console's API (docs/operators/console.md)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
import textwrap
from typing import Any

import anyio
import anyio.abc

from outbox.errors import ConfigError
from outbox.service.cli.common import DATABASE, LOGS, embedded_flag, service_settings, settings_help
from outbox.service.settings import ServiceSettings, UiSettings, load

log = logging.getLogger("outbox.ui")


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    ui = commands.add_parser(
        "ui",
        help="serve the operator console (pages and API)",
        description=textwrap.fill(
            "Serve the operator console, HTML pages and a JSON API (/api/v1), over the "
            "relays' database: topics, messages, relays, blocked keys; requeue and purge "
            "buried messages by a filter; pause and resume topics. Viewers read; "
            "operators change. Without OUTBOX_UI_TOKENS_FILE or a proxy it listens on "
            "loopback only, and every visitor is a viewer.",
            78,
        ),
        epilog=settings_help(
            ServiceSettings,
            UiSettings,
            only=(
                *DATABASE,
                *LOGS,
                "OUTBOX_UI_HOST",
                "OUTBOX_UI_PORT",
                "OUTBOX_UI_TOKENS_FILE",
                "OUTBOX_UI_SESSION_KEY",
                "OUTBOX_UI_BASE_PATH",
                "OUTBOX_UI_PROXY_ADDRESSES",
                "OUTBOX_UI_PROXY_USER_HEADER",
                "OUTBOX_UI_PROXY_GROUPS_HEADER",
                "OUTBOX_UI_PROXY_OPERATOR_GROUPS",
                "OUTBOX_UI_PROXY_VIEWER_GROUPS",
                "OUTBOX_UI_PROMETHEUS_URL",
                "OUTBOX_UI_TRACE_URL",
            ),
        ),
        formatter_class=formatter,
    )
    ui.set_defaults(func=run)
    embedded_flag(ui)


def loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(a).is_loopback for a in found)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from outbox.postgres import PostgresStore, connect_pool
    from outbox.service.process import database
    from outbox.service.ui import Access, Console, Proxy, TokenFile

    settings = service_settings()
    own = load(UiSettings)
    networks = own.proxy_networks()
    if own.tokens_file is None and not networks and not loopback(own.host):
        raise ConfigError(
            "OUTBOX_UI_HOST",
            f"{own.host} is beyond loopback and no authentication is set: set "
            "OUTBOX_UI_TOKENS_FILE or OUTBOX_UI_PROXY_ADDRESSES, or listen on 127.0.0.1 "
            "(kubectl port-forward reaches it)",
        )
    if settings.database_url is None and not args.embedded:
        raise ConfigError(
            "OUTBOX_DATABASE_URL",
            "unset; set it to the relays' database (or pass --embedded for the local "
            "embedded one under OUTBOX_DATA_DIR)",
        )
    tokens = None if own.tokens_file is None else TokenFile(own.tokens_file)
    proxy = None
    if networks:
        operators, viewers = own.groups()
        proxy = Proxy(
            tuple(networks),
            own.proxy_user_header,
            own.proxy_groups_header,
            operators,
            viewers,
        )
    key = None if own.session_key is None else own.session_key.get_secret_value().encode()
    access = Access(tokens, session_key=key, proxy=proxy)
    if tokens is not None and key is None:
        log.info(
            "OUTBOX_UI_SESSION_KEY is unset: sessions end with a restart and do not cross replicas"
        )

    async def main() -> None:
        async with database(settings) as url, connect_pool(url, max_size=4) as pool:
            console = Console(
                PostgresStore(pool),
                access=access,
                base=own.base_path,
                prometheus_url=own.prometheus_url,
                trace_url=own.trace_url,
            )
            runner = web.AppRunner(console.app(), access_log=None, handle_signals=False)
            await runner.setup()
            try:
                site = web.TCPSite(runner, own.host, own.port)
                await site.start()
                host, port = runner.addresses[0][:2]
                who = (
                    ", ".join(w for w, on in (("tokens", tokens), ("proxy", proxy)) if on)
                    or "none: every visitor is a viewer"
                )
                log.info(
                    "console listening on http://%s:%d%s/ (authentication: %s)",
                    host,
                    port,
                    own.base_path,
                    who,
                )
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        break
            finally:
                with anyio.CancelScope(shield=True):
                    await runner.cleanup()
        log.info("console stopped")

    anyio.run(main)
    return 0
