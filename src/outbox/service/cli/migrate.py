"""`outbox migrate`: apply the schema, or print it (--sql) for your own migrations."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from typing import Any

import anyio

from outbox.errors import ConfigError
from outbox.service.cli.common import (
    DATABASE,
    LOGS,
    duration,
    service_settings,
    settings_help,
)
from outbox.service.settings import ServiceSettings

log = logging.getLogger("outbox.service.cli")


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox schema, then exit",
        description=(
            "Apply the schema migrations the database lacks. Safe from several pods. "
            "--sql prints every migration's DDL instead, for Alembic or Django migrations to own."
        ),
        epilog=settings_help(ServiceSettings, only=DATABASE + LOGS),
        formatter_class=formatter,
    )
    migrate.add_argument(
        "--sql",
        action="store_true",
        help="print the DDL of every migration in order (idempotent) without connecting",
    )
    migrate.add_argument(
        "--grants",
        nargs="+",
        metavar="KIND=ROLE",
        help=(
            "print the GRANTs a least-privilege setup needs for each KIND (relay, producer, "
            "controller, operator) given to ROLE, without connecting; --schema names the schema"
        ),
    )
    migrate.add_argument("--schema", default="public", help="the schema of --grants")
    migrate.add_argument(
        "--wait",
        type=duration,
        default=dt.timedelta(seconds=60),
        help=(
            "how long to keep retrying a lock another session holds before giving up "
            "(default 60s); producers wait at most 0.8s behind each try"
        ),
    )
    migrate.add_argument(
        "--allow-trigger",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            "a trigger of your own on an outbox table (an audit trigger) that migrate may "
            "keep; any other trigger it did not create makes migrate refuse (repeatable)"
        ),
    )
    migrate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from outbox.postgres import migrate, migrations_sql
    from outbox.service.process import database

    if args.sql:
        sys.stdout.write(migrations_sql())
        return 0
    if args.grants:
        from outbox.postgres.schema import grants_sql

        roles = {}
        for item in args.grants:
            kind, sep, role = item.partition("=")
            if not sep:
                raise ConfigError(
                    "--grants", f"{item!r} is not KIND=ROLE (like relay=outbox_relay)"
                )
            roles[kind] = role
        try:
            sys.stdout.write(grants_sql(roles, args.schema))
        except ValueError as exc:
            raise ConfigError("--grants", str(exc)) from None
        return 0

    settings = service_settings()

    async def run() -> list[int]:
        async with database(settings, migrate_embedded=False) as url:
            return await migrate(
                url, wait=args.wait.total_seconds(), allow_triggers=args.allow_trigger
            )

    applied = anyio.run(run)
    log.info("schema up to date; applied %s", applied or "nothing")
    return 0
