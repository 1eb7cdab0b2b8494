"""`outbox buried`: list, show, requeue and purge buried messages."""

from __future__ import annotations

import argparse
from typing import Any

from outbox.errors import ConfigError
from outbox.requests import MAX_ERROR_TEXT
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
from outbox.store import BuriedFilter


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
    _selecting(requeue, "requeue")
    requeue.add_argument("--dry-run", action="store_true", help="say what would change")
    requeue.add_argument("--yes", action="store_true", help="do not ask before --all")
    requeue.set_defaults(func=_buried_requeue)
    embedded_flag(requeue)

    purge = actions.add_parser("purge", help="delete buried messages past retention")
    _selecting(purge, "delete")
    purge.add_argument("--dry-run", action="store_true", help="say what would be deleted")
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=_buried_purge)
    embedded_flag(purge)


def _selecting(parser: argparse.ArgumentParser, verb: str) -> None:
    """The selection of buried messages a requeue or purge acts on: every
    option given narrows it (ids, topic, age, error text); --all alone is all."""
    parser.add_argument("ids", nargs="*", type=message_id, metavar="ID")
    parser.add_argument("--topic", type=topic, help=f"{verb} only this topic's")
    parser.add_argument(
        "--older-than", type=duration, help=f"{verb} only those buried longer ago than this (7d)"
    )
    parser.add_argument(
        "--error-contains",
        type=_error_text,
        metavar="TEXT",
        help=f"{verb} only those whose last error contains TEXT (any case)",
    )
    parser.add_argument("--all", action="store_true", help=f"{verb} every buried message")


def _error_text(text: str) -> str:
    if not text or len(text) > MAX_ERROR_TEXT:
        raise argparse.ArgumentTypeError(f"give 1 to {MAX_ERROR_TEXT} characters")
    return text


def _selection(args: argparse.Namespace, verb: str) -> BuriedFilter:
    """The selection the options name; --all alone, or at least one narrowing."""
    chosen = BuriedFilter(
        ids=tuple(args.ids) if args.ids else None,
        topic=args.topic,
        older_than=args.older_than,
        error_contains=args.error_contains,
    )
    if args.all != chosen.everything:
        raise ConfigError(
            verb,
            "name message ids, or narrow with --topic, --older-than, --error-contains,"
            " or --all (alone)",
        )
    return chosen


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
    chosen = _selection(args, "requeue")
    return with_store(
        lambda store: admin.requeue(store, chosen, dry_run=args.dry_run, yes=args.yes), args
    )


def _buried_purge(args: argparse.Namespace) -> int:
    chosen = _selection(args, "purge")
    return with_store(
        lambda store: admin.purge(store, chosen, dry_run=args.dry_run, yes=args.yes), args
    )
