"""`outbox buried`: list, show, requeue and purge buried messages."""

from __future__ import annotations

import argparse
from typing import Any

from outbox.errors import ConfigError
from outbox.service import admin
from outbox.service.cli.common import (
    DATABASE,
    Parser,
    duration,
    embedded_flag,
    message_id,
    positive,
    settings_help,
    topic,
    with_store,
)
from outbox.service.settings import ServiceSettings


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    buried = commands.add_parser(
        "buried",
        help="inspect, requeue and purge buried messages",
        description=(
            "What to run when OutboxMessagesBuried fires. Reads the same settings as the relay."
        ),
        epilog=settings_help(ServiceSettings, only=DATABASE),
        formatter_class=formatter,
    )
    actions = buried.add_subparsers(dest="action", required=True, parser_class=Parser)

    ls = actions.add_parser("list", help="buried messages, newest first")
    ls.add_argument("--topic", type=topic, help="only this topic")
    ls.add_argument("--since", type=duration, help="only those buried within this long (1h, 7d)")
    ls.add_argument("--limit", type=positive, default=100, help="at most this many (default 100)")
    ls.add_argument("--output", choices=("table", "json"), default="table")
    ls.set_defaults(func=_buried_list)
    embedded_flag(ls)

    show = actions.add_parser("show", help="every field of one message")
    show.add_argument("id", type=message_id)
    show.add_argument(
        "--payload", action="store_true", help="print the payload too (it can hold one-time codes)"
    )
    show.add_argument("--output", choices=("text", "json"), default="text")
    show.set_defaults(func=_buried_show)
    embedded_flag(show)

    requeue = actions.add_parser(
        "requeue", help="make buried messages due now, attempts reset (last error kept)"
    )
    requeue.add_argument("ids", nargs="*", type=message_id, metavar="ID")
    requeue.add_argument("--topic", type=topic, help="every buried message of this topic")
    requeue.add_argument("--all", action="store_true", help="every buried message")
    requeue.add_argument("--dry-run", action="store_true", help="say what would change")
    requeue.add_argument("--yes", action="store_true", help="do not ask before --all")
    requeue.set_defaults(func=_buried_requeue)
    embedded_flag(requeue)

    purge = actions.add_parser("purge", help="delete buried messages past retention")
    purge.add_argument(
        "--older-than", type=duration, required=True, help="buried longer ago than this (7d)"
    )
    purge.add_argument("--topic", type=topic, help="only this topic")
    purge.add_argument("--dry-run", action="store_true", help="say what would be deleted")
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=_buried_purge)
    embedded_flag(purge)


def _buried_list(args: argparse.Namespace) -> int:
    return with_store(
        lambda store: admin.list_buried(
            store, topic=args.topic, within=args.since, limit=args.limit, output=args.output
        ),
        args,
    )


def _buried_show(args: argparse.Namespace) -> int:
    return with_store(
        lambda store: admin.show(store, args.id, payload=args.payload, output=args.output), args
    )


def _buried_requeue(args: argparse.Namespace) -> int:
    chosen = sum((bool(args.ids), args.topic is not None, args.all))
    if chosen != 1:
        raise ConfigError("requeue", "name message ids, or --topic T, or --all (one of them)")
    return with_store(
        lambda store: admin.requeue(
            store,
            ids=args.ids or None,
            topic=args.topic,
            dry_run=args.dry_run,
            yes=args.yes,
        ),
        args,
    )


def _buried_purge(args: argparse.Namespace) -> int:
    return with_store(
        lambda store: admin.purge(
            store, args.older_than, topic=args.topic, dry_run=args.dry_run, yes=args.yes
        ),
        args,
    )
