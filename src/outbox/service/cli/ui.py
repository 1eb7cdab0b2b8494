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
        help="serve the operator console's API",
        description=textwrap.fill(
            "Serve the operator console's JSON API (/api/v1) over the relays' database: "
            "topics, relays, blocked keys; requeue and purge buried messages by a filter. "
            "Viewers read; operators change. Without OUTBOX_UI_TOKENS_FILE it listens on "
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
    from outbox.service.ui import Console, TokenFile

    settings = service_settings()
    own = load(UiSettings)
    if own.tokens_file is None and not loopback(own.host):
        raise ConfigError(
            "OUTBOX_UI_HOST",
            f"{own.host} is beyond loopback and no authentication is set: set "
            "OUTBOX_UI_TOKENS_FILE, or listen on 127.0.0.1 (kubectl port-forward reaches it)",
        )
    if settings.database_url is None and not args.embedded:
        raise ConfigError(
            "OUTBOX_DATABASE_URL",
            "unset; set it to the relays' database (or pass --embedded for the local "
            "embedded one under OUTBOX_DATA_DIR)",
        )
    tokens = None if own.tokens_file is None else TokenFile(own.tokens_file)

    async def main() -> None:
        async with database(settings) as url, connect_pool(url, max_size=4) as pool:
            console = Console(PostgresStore(pool), tokens)
            runner = web.AppRunner(console.app(), access_log=None, handle_signals=False)
            await runner.setup()
            try:
                site = web.TCPSite(runner, own.host, own.port)
                await site.start()
                host, port = runner.addresses[0][:2]
                who = "tokens" if tokens else "none: every visitor is a viewer"
                log.info("console listening on http://%s:%d (authentication: %s)", host, port, who)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        break
            finally:
                with anyio.CancelScope(shield=True):
                    await runner.cleanup()
        log.info("console stopped")

    anyio.run(main)
    return 0
