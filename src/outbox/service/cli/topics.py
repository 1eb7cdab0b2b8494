"""`outbox topics`: the topic registry outside Kubernetes."""

from __future__ import annotations

import argparse
from typing import Any

from outbox.clock import system_clock
from outbox.handlers import HandlerKinds
from outbox.postgres import PostgresStore
from outbox.service import admin
from outbox.service.cli.common import (
    DATABASE,
    Parser,
    attempts,
    embedded_flag,
    force_flag,
    json_object,
    optional,
    positive,
    positive_duration,
    settings_help,
    topic,
    with_store,
)
from outbox.service.settings import (
    RelaySettings,
    ServiceSettings,
    kind_settings,
    relay_config,
)
from outbox.store import TopicSettings


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    topics = commands.add_parser(
        "topics",
        help="list, pause, resume and tune topics (the registry relays read)",
        description=(
            "Edit the topic registry every relay reads at most once an interval. In Kubernetes "
            "the controller writes it from OutboxTopic resources; these commands are for "
            "everywhere else."
        ),
        epilog=settings_help(ServiceSettings, RelaySettings, only=(*DATABASE, "OUTBOX_LEASE")),
        formatter_class=formatter,
    )
    actions = topics.add_subparsers(dest="action", required=True, parser_class=Parser)
    ls = actions.add_parser("list", help="every registered topic and every topic with messages")
    ls.add_argument("--output", choices=("table", "json"), default="table")
    ls.set_defaults(func=_topics_list)
    embedded_flag(ls)

    tune = actions.add_parser("set", help="create or change a topic's entry")
    tune.add_argument("topic", type=topic)
    tune.add_argument("--handler", type=optional(str), help="a handler kind or built-in topic")
    tune.add_argument("--config", type=optional(json_object), help="the handler's config (JSON)")
    tune.add_argument("--max-attempts", type=optional(attempts), help="or 'default'")
    tune.add_argument(
        "--timeout", type=optional(positive_duration), help="below OUTBOX_LEASE, or 'default'"
    )
    tune.add_argument(
        "--max-in-flight",
        type=optional(positive),
        help="most deliveries of the topic in flight in one relay, or 'default'",
    )
    tune.add_argument(
        "--on-buried",
        choices=("block", "skip"),
        help="what a buried message does to the later ones of its key: they wait "
        "until it is requeued or purged (block, the default) or go on (skip)",
    )
    state = tune.add_mutually_exclusive_group()
    state.add_argument("--enabled", dest="enabled", action="store_const", const=True)
    state.add_argument("--paused", dest="enabled", action="store_const", const=False)
    tune.set_defaults(func=_topics_set)
    embedded_flag(tune)
    force_flag(tune)

    for name, enabled in (("pause", False), ("resume", True)):
        act = actions.add_parser(name, help=f"{name} delivery of a topic")
        act.add_argument("topic", type=topic)
        act.set_defaults(func=_topics_set, enabled=enabled, handler=None, config=None)
        act.set_defaults(max_attempts=None, timeout=None, max_in_flight=None, on_buried=None)
        embedded_flag(act)
        force_flag(act)

    delete = actions.add_parser(
        "delete", help="remove a topic's entry: back to its built-in handler (not a pause)"
    )
    delete.add_argument("topic", type=topic)
    delete.set_defaults(func=_topics_delete)
    embedded_flag(delete)
    force_flag(delete)


def _topics_list(args: argparse.Namespace) -> int:
    return with_store(lambda store: admin.topics_list(store, output=args.output), args)


def _topics_set(args: argparse.Namespace) -> int:
    lease = relay_config().lease
    kinds = HandlerKinds(**kind_settings()).mapping
    if args.handler is not None and args.handler is not admin.DEFAULT:
        # What the arguments say on their own is checked before any connection.
        alone = TopicSettings(args.topic, handler=args.handler, config=args.config or {})
        admin.checked(alone, lease=lease, kinds=kinds)
    return with_store(
        lambda store: admin.topics_set(
            store,
            args.topic,
            system_clock(),
            lease=lease,
            kinds=kinds,
            enabled=args.enabled,
            handler=args.handler,
            config=args.config,
            max_attempts=args.max_attempts,
            timeout=args.timeout,
            max_in_flight=args.max_in_flight,
            on_buried=args.on_buried,
            force=args.force,
        ),
        args,
    )


def _topics_delete(args: argparse.Namespace) -> int:
    async def delete(store: PostgresStore) -> None:
        admin.governed((await store.topics()).get(args.topic), force=args.force, deleting=True)
        found = await store.delete_topic(args.topic)
        print(f"{args.topic}: entry deleted" if found else f"{args.topic}: had no entry")

    return with_store(delete, args)
