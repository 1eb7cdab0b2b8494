"""`outbox keys blocked`: keys whose messages wait behind a buried or failing head."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from outbox.postgres import PostgresStore
from outbox.service.admin.output import print_json, table
from outbox.service.cli.common import DATABASE, embedded_flag, settings_help, topic, with_store
from outbox.service.settings import ServiceSettings
from outbox.store import BlockedKey


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    keys = commands.add_parser(
        "keys",
        help="keys whose messages wait behind a buried or failing message",
        description=(
            "Messages that share a key are delivered one at a time, in order. A key whose "
            "first message is buried (on a topic that blocks, the default) or keeps failing "
            "holds the rest of its messages: `outbox buried requeue` or `purge` the head, or "
            "`outbox topics set TOPIC --on-buried skip`."
        ),
        formatter_class=formatter,
    )
    actions = keys.add_subparsers(dest="action", required=True)
    blocked = actions.add_parser(
        "blocked",
        help="the blocked keys, longest blocked first",
        epilog=settings_help(ServiceSettings, only=DATABASE),
        formatter_class=formatter,
    )
    blocked.add_argument("--topic", type=topic, help="only this topic")
    blocked.add_argument("--limit", type=int, default=100)
    blocked.add_argument("--output", choices=("table", "json"), default="table")
    blocked.set_defaults(func=run)
    embedded_flag(blocked)


def run(args: argparse.Namespace) -> int:
    async def show(store: PostgresStore) -> None:
        found = await store.keys_blocked(topic=args.topic, limit=args.limit)
        write(found, args.output)

    return with_store(show, args)


def write(found: list[BlockedKey], output: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # the stream of now, not of import time
    if output == "json":
        rows = [
            {
                "topic": b.topic,
                "key": b.key,
                "head": str(b.head),
                "since": b.since.isoformat(),
                "buried": b.buried,
                "reason": b.reason,
                "waiting": b.waiting,
            }
            for b in found
        ]
        print_json(rows, out)
        return
    if not found:
        out.write("no blocked keys\n")
        return
    rows_t = [["TOPIC", "KEY", "HEAD", "SINCE", "STATE", "WAITING", "REASON"]]
    for b in found:
        state = "buried" if b.buried else "failing"
        since = b.since.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = (b.reason or "").splitlines()[0][:80] if b.reason else ""
        rows_t.append([b.topic, b.key, str(b.head), since, state, str(b.waiting), reason])
    table(rows_t, out)
