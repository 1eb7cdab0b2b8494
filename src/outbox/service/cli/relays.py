"""`outbox relays`: the live relays and what each serves."""

from __future__ import annotations

import argparse
from typing import Any

from outbox.service import admin
from outbox.service.cli.common import (
    DATABASE,
    embedded_flag,
    settings_help,
    with_store,
)
from outbox.service.settings import ServiceSettings


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    relays = commands.add_parser(
        "relays",
        help="list the live relays and the topics each serves",
        description=(
            "List the relay processes that refreshed their registration recently, with the "
            "topics and handler kinds each serves. A topic only some relays serve is named "
            "below the table."
        ),
        epilog=settings_help(ServiceSettings, only=DATABASE),
        formatter_class=formatter,
    )
    relays.add_argument("--output", choices=("table", "json"), default="table")
    relays.set_defaults(func=run)
    embedded_flag(relays)


def run(args: argparse.Namespace) -> int:
    return with_store(lambda store: admin.relays_list(store, output=args.output), args)
