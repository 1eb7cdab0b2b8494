"""The ``outbox`` command: the composition root, from settings to a running process.

Errors a user can fix (a bad setting, an unreachable database) end as one line
on stderr and a non-zero exit: 2 for configuration and usage, 1 for the rest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import logging
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

import anyio
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from outbox.durations import parse_duration
from outbox.errors import ConfigError, NotFound, OutboxError
from outbox.handlers import HandlerKinds, log_handler
from outbox.message import validate_topic
from outbox.postgres import PostgresStore, connect_pool
from outbox.relay import Handler, system_clock
from outbox.service import admin, logs
from outbox.service.settings import (
    ControllerSettings,
    NatsSettings,
    RelayConfig,
    RelaySettings,
    ServiceSettings,
    SmtpSettings,
    WebhookSettings,
    config_error,
    load,
    variables,
)

__all__ = ["run"]

log = logging.getLogger("outbox.service.cli")

_DATABASE = ("OUTBOX_DATABASE_URL", "OUTBOX_DATA_DIR")
_LOGS = ("OUTBOX_LOG_LEVEL", "OUTBOX_LOG_FORMAT")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _settings_help(*models: type[BaseSettings], only: Sequence[str] = ()) -> str:
    rows = [r for r in variables(*models) if not only or r[0] in only]
    width = max(len(r[0]) for r in rows)
    lines = ["settings (environment variables):"]
    for name, default, description in rows:
        text = f"{description} Default: {default}."
        wrapped = textwrap.wrap(text, 78 - width - 4) or [""]
        lines.append(f"  {name:<{width}}  {wrapped[0]}")
        lines.extend(f"  {'':<{width}}  {more}" for more in wrapped[1:])
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox",
        description="Transactional outbox: relay messages from PostgreSQL to their handlers.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    formatter = argparse.RawDescriptionHelpFormatter

    relay = commands.add_parser(
        "relay",
        help="run a relay: claim due messages and deliver them",
        description=textwrap.fill(
            "Claim due messages under a lease and deliver each to its topic's handler; serve "
            "/metrics, /healthz and /readyz. Without OUTBOX_DATABASE_URL, start an embedded "
            "PostgreSQL under OUTBOX_DATA_DIR. SIGTERM stops it gracefully: handlers in flight "
            "finish within OUTBOX_TIMEOUT and unfinished messages are handed back.",
            78,
        ),
        epilog=_settings_help(
            ServiceSettings, RelaySettings, SmtpSettings, NatsSettings, WebhookSettings
        ),
        formatter_class=formatter,
    )
    relay.set_defaults(func=_relay)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox schema, then exit",
        description=(
            "Apply the schema migrations the database lacks. Safe from several pods. "
            "--sql prints every migration's DDL instead, for Alembic or Django migrations to own."
        ),
        epilog=_settings_help(ServiceSettings, only=_DATABASE + _LOGS),
        formatter_class=formatter,
    )
    migrate.add_argument(
        "--sql",
        action="store_true",
        help="print the DDL of every migration in order (idempotent) without connecting",
    )
    migrate.set_defaults(func=_migrate)

    controller = commands.add_parser(
        "controller",
        help="run the OutboxTopic controller (Kubernetes)",
        description=textwrap.fill(
            "Watch OutboxTopic resources and write the topic registry relays read; keep each "
            "resource's status current. Watches POD_NAMESPACE unless --all-namespaces.",
            78,
        ),
        epilog=_settings_help(
            ServiceSettings,
            RelaySettings,
            ControllerSettings,
            only=(
                *_DATABASE,
                *_LOGS,
                "OUTBOX_LEASE",
                "OUTBOX_CONTROLLER_STATUS_INTERVAL",
                "OUTBOX_CONTROLLER_PEERING",
                "OUTBOX_CONTROLLER_PRIORITY",
                "OUTBOX_CONTROLLER_METRICS_PORT",
            ),
        ),
        formatter_class=formatter,
    )
    controller.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (cluster-wide)"
    )
    controller.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica only"
    )
    controller.set_defaults(func=_controller)

    _buried_parser(commands, formatter)
    _topics_parser(commands, formatter)

    relays = commands.add_parser(
        "relays",
        help="list the live relays and the topics each serves",
        description=(
            "List the relay processes that refreshed their registration recently, with the "
            "topics and handler kinds each serves. A topic only some relays serve is named "
            "below the table."
        ),
        epilog=_settings_help(ServiceSettings, only=_DATABASE),
        formatter_class=formatter,
    )
    relays.add_argument("--output", choices=("table", "json"), default="table")
    relays.set_defaults(func=_relays)
    _embedded_flag(relays)

    env = commands.add_parser(
        "env",
        help="list every OUTBOX_* variable with its default",
        description="List every OUTBOX_* setting, its default and what it does.",
    )
    env.add_argument("--markdown", action="store_true", help="as a Markdown table")
    env.set_defaults(func=_env)
    return parser


def _duration(text: str) -> dt.timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a message id (a UUID)") from None


def _topic(text: str) -> str:
    try:
        return validate_topic(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("outbox: ")) from None


def _buried_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    buried = commands.add_parser(
        "buried",
        help="inspect, requeue and purge buried messages",
        description=(
            "What to run when OutboxMessagesBuried fires. Reads the same settings as the relay."
        ),
        epilog=_settings_help(ServiceSettings, only=_DATABASE),
        formatter_class=formatter,
    )
    actions = buried.add_subparsers(dest="action", required=True, parser_class=_Parser)

    ls = actions.add_parser("list", help="buried messages, newest first")
    ls.add_argument("--topic", type=_topic, help="only this topic")
    ls.add_argument("--since", type=_duration, help="only those buried within this long (1h, 7d)")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--output", choices=("table", "json"), default="table")
    ls.set_defaults(func=_buried_list)
    _embedded_flag(ls)

    show = actions.add_parser("show", help="every field of one message")
    show.add_argument("id", type=_uuid)
    show.add_argument(
        "--payload", action="store_true", help="print the payload too (it can hold one-time codes)"
    )
    show.add_argument("--output", choices=("text", "json"), default="text")
    show.set_defaults(func=_buried_show)
    _embedded_flag(show)

    requeue = actions.add_parser(
        "requeue", help="make buried messages due now, attempts reset (last error kept)"
    )
    requeue.add_argument("ids", nargs="*", type=_uuid, metavar="ID")
    requeue.add_argument("--topic", type=_topic, help="every buried message of this topic")
    requeue.add_argument("--all", action="store_true", help="every buried message")
    requeue.add_argument("--dry-run", action="store_true", help="say what would change")
    requeue.add_argument("--yes", action="store_true", help="do not ask before --all")
    requeue.set_defaults(func=_buried_requeue)
    _embedded_flag(requeue)

    purge = actions.add_parser("purge", help="delete buried messages past retention")
    purge.add_argument(
        "--older-than", type=_duration, required=True, help="buried longer ago than this (7d)"
    )
    purge.add_argument("--topic", type=_topic, help="only this topic")
    purge.add_argument("--dry-run", action="store_true", help="say what would be deleted")
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=_buried_purge)
    _embedded_flag(purge)


def _force_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="change an entry an OutboxTopic governs (the controller will put it back)",
    )


def _embedded_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="without OUTBOX_DATABASE_URL, use the local embedded PostgreSQL (OUTBOX_DATA_DIR)",
    )


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type that also takes ``default`` (clear the override)."""

    def parse_or_default(text: str) -> Any:
        return admin.DEFAULT if text == "default" else parse(text)

    return parse_or_default


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _topics_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    topics = commands.add_parser(
        "topics",
        help="list, pause, resume and tune topics (the registry relays read)",
        description=(
            "Edit the topic registry every relay reads at most once an interval. In Kubernetes "
            "the controller writes it from OutboxTopic resources; these commands are for "
            "everywhere else."
        ),
        epilog=_settings_help(ServiceSettings, RelaySettings, only=(*_DATABASE, "OUTBOX_LEASE")),
        formatter_class=formatter,
    )
    actions = topics.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ls = actions.add_parser("list", help="every registered topic and every topic with messages")
    ls.add_argument("--output", choices=("table", "json"), default="table")
    ls.set_defaults(func=_topics_list)
    _embedded_flag(ls)

    tune = actions.add_parser("set", help="create or change a topic's entry")
    tune.add_argument("topic", type=_topic)
    tune.add_argument("--handler", type=_optional(str), help="a handler kind or built-in topic")
    tune.add_argument("--config", type=_optional(_json_object), help="the handler's config (JSON)")
    tune.add_argument("--max-attempts", type=_optional(_positive), help="or 'default'")
    tune.add_argument(
        "--timeout", type=_optional(_duration), help="below OUTBOX_LEASE, or 'default'"
    )
    tune.add_argument(
        "--max-in-flight",
        type=_optional(_positive),
        help="most deliveries of the topic in flight in one relay, or 'default'",
    )
    state = tune.add_mutually_exclusive_group()
    state.add_argument("--enabled", dest="enabled", action="store_const", const=True)
    state.add_argument("--paused", dest="enabled", action="store_const", const=False)
    tune.set_defaults(func=_topics_set)
    _embedded_flag(tune)
    _force_flag(tune)

    for name, enabled in (("pause", False), ("resume", True)):
        act = actions.add_parser(name, help=f"{name} delivery of a topic")
        act.add_argument("topic", type=_topic)
        act.set_defaults(func=_topics_set, enabled=enabled, handler=None, config=None)
        act.set_defaults(max_attempts=None, timeout=None, max_in_flight=None)
        _embedded_flag(act)
        _force_flag(act)

    delete = actions.add_parser(
        "delete", help="remove a topic's entry: back to its built-in handler (not a pause)"
    )
    delete.add_argument("topic", type=_topic)
    delete.set_defaults(func=_topics_delete)
    _embedded_flag(delete)
    _force_flag(delete)


def _relays(args: argparse.Namespace) -> int:
    return _with_store(lambda store: admin.relays_list(store, output=args.output), args)


def _topics_list(args: argparse.Namespace) -> int:
    return _with_store(lambda store: admin.topics_list(store, output=args.output), args)


def _topics_set(args: argparse.Namespace) -> int:
    lease = RelayConfig.from_env().lease
    return _with_store(
        lambda store: admin.topics_set(
            store,
            args.topic,
            system_clock(),
            lease=lease,
            enabled=args.enabled,
            handler=args.handler,
            config=args.config,
            max_attempts=args.max_attempts,
            timeout=args.timeout,
            max_in_flight=args.max_in_flight,
            force=args.force,
        ),
        args,
    )


def _topics_delete(args: argparse.Namespace) -> int:
    async def delete(store: PostgresStore) -> None:
        admin.governed((await store.topics()).get(args.topic), force=args.force)
        found = await store.delete_topic(args.topic)
        print(f"{args.topic}: entry deleted" if found else f"{args.topic}: had no entry")

    return _with_store(delete, args)


def _with_store(
    work: Callable[[PostgresStore], Awaitable[object]], args: argparse.Namespace
) -> int:
    """Run ``work`` on a store over OUTBOX_DATABASE_URL (or, with --embedded, the local one).

    An operator's command never starts an empty database by surprise: "no buried
    messages" from a database the relays do not use would be a false all-clear.
    """
    from outbox.service.process import database

    settings = load(ServiceSettings)
    if settings.database_url is None and not args.embedded:
        raise ConfigError(
            "OUTBOX_DATABASE_URL",
            "unset; set it to the relays' database (or pass --embedded for the local "
            "embedded one under OUTBOX_DATA_DIR)",
        )
    level = "warning" if settings.log_level in ("debug", "info") else settings.log_level
    logs.configure(level, settings.log_format)

    async def run() -> None:
        async with database(settings) as url, connect_pool(url, max_size=2) as pool:
            await work(PostgresStore(pool))

    anyio.run(run)
    return 0


def _buried_list(args: argparse.Namespace) -> int:
    since = None if args.since is None else system_clock() - args.since
    return _with_store(
        lambda store: admin.list_buried(
            store, topic=args.topic, since=since, limit=args.limit, output=args.output
        ),
        args,
    )


def _buried_show(args: argparse.Namespace) -> int:
    return _with_store(
        lambda store: admin.show(store, args.id, payload=args.payload, output=args.output), args
    )


def _buried_requeue(args: argparse.Namespace) -> int:
    chosen = sum((bool(args.ids), args.topic is not None, args.all))
    if chosen != 1:
        raise ConfigError("requeue", "name message ids, or --topic T, or --all (one of them)")
    return _with_store(
        lambda store: admin.requeue(
            store,
            system_clock(),
            ids=args.ids or None,
            topic=args.topic,
            dry_run=args.dry_run,
            yes=args.yes,
        ),
        args,
    )


def _buried_purge(args: argparse.Namespace) -> int:
    before = system_clock() - args.older_than
    return _with_store(
        lambda store: admin.purge(
            store, before, topic=args.topic, dry_run=args.dry_run, yes=args.yes
        ),
        args,
    )


def _service_settings() -> ServiceSettings:
    settings = load(ServiceSettings)
    logs.configure(settings.log_level, settings.log_format)
    return settings


def _relay(args: argparse.Namespace) -> int:
    from outbox.service.process import run_relay

    settings = _service_settings()
    config = RelayConfig.from_env()
    handlers = _handlers(settings)
    anyio.run(run_relay, settings, config, handlers)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from outbox.postgres import migrate, migrations_sql
    from outbox.service.process import database

    if args.sql:
        sys.stdout.write(migrations_sql())
        return 0

    settings = _service_settings()

    async def run() -> list[int]:
        async with database(settings, migrate_embedded=False) as url:
            return await migrate(url)

    applied = anyio.run(run)
    log.info("schema up to date; applied %s", applied or "nothing")
    return 0


def _controller(args: argparse.Namespace) -> int:
    import os

    from outbox.controller import ControllerConfig, run
    from outbox.service.http import ProbeServer
    from outbox.service.process import database

    settings = _service_settings()
    lease = RelayConfig.from_env().lease
    own = load(ControllerSettings)
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not args.all_namespaces and not namespace:
        raise ConfigError(
            "POD_NAMESPACE", "unset; set it (the downward API) or pass --all-namespaces"
        )

    async def main() -> None:
        async with database(settings) as url:
            config = ControllerConfig(
                conninfo=url,
                lease=lease,
                status_interval=own.status_interval.total_seconds(),
                kinds=HandlerKinds(webhook=load(WebhookSettings)).mapping,
            )
            async with anyio.create_task_group() as tg:
                # /metrics for Prometheus: its `up` is what OutboxControllerAbsent reads.
                probes = ProbeServer("0.0.0.0", own.metrics_port, alive=lambda: True, ready=_always)
                await tg.start(probes.serve)
                await run(
                    config,
                    namespaces=[namespace],
                    clusterwide=args.all_namespaces,
                    peering=None if args.standalone else own.peering,
                    health_port=own.health_port,
                    priority=own.priority,
                )
                tg.cancel_scope.cancel()

    anyio.run(main)
    return 0


async def _always() -> bool:
    return True


def _env(args: argparse.Namespace) -> int:
    rows = variables(
        ServiceSettings,
        RelaySettings,
        SmtpSettings,
        NatsSettings,
        WebhookSettings,
        ControllerSettings,
    )
    if args.markdown:
        print("| variable | default | meaning |\n| --- | --- | --- |")
        for name, default, description in rows:
            print(f"| `{name}` | `{default}` | {description} |")
    else:
        width = max(len(r[0]) for r in rows)
        for name, default, description in rows:
            print(f"{name:<{width}}  {default:<10}  {description}")
    return 0


def _handlers(settings: ServiceSettings) -> dict[str, Handler]:
    """The handlers this relay enables: the application's, then the log handler's topics."""
    handlers: dict[str, Handler] = {}
    smtp = load(SmtpSettings)
    if smtp.enabled:
        from outbox.handlers.mail import mail_handlers

        handlers.update(mail_handlers(smtp))
    if settings.handlers:
        for topic, handler in _import_handlers(settings.handlers).items():
            handlers[topic] = handler  # the application's own win over built-in ones
    for topic in settings.topics_to_log():
        if topic in handlers:
            raise ConfigError("OUTBOX_LOG_TOPICS", f"{topic} already has a handler")
        handlers[topic] = log_handler
    if not handlers:
        # Topics bound in the registry (webhook, nats, log) still flow; a topic
        # neither bound nor built in is buried with "no handler", as always.
        log.warning(
            "no built-in handlers enabled (OUTBOX_SMTP_HOST, OUTBOX_HANDLERS, OUTBOX_LOG_TOPICS): "
            "only topics bound in the topic registry are delivered"
        )
    return handlers


def _import_handlers(spec: str) -> Mapping[str, Handler]:
    module_name, _, attribute = spec.partition(":")
    try:
        found: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("OUTBOX_HANDLERS", f"cannot load {spec}: {exc}") from None
    if callable(found) and not isinstance(found, Mapping):
        found = found()
    if not isinstance(found, Mapping) or not all(callable(h) for h in found.values()):
        raise ConfigError("OUTBOX_HANDLERS", f"{spec} is not a mapping of topic to handler")
    return found


def _one_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command (outbox.service.cli.main wraps it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    prog = " ".join(["outbox", args.command, *([args.action] if "action" in args else [])])
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BaseException as raw:
        exc = _one_error(raw)
        if isinstance(exc, ValidationError):
            exc = config_error(ServiceSettings, exc)
        if isinstance(exc, ConfigError | NotFound):
            print(f"{prog}: {str(exc).removeprefix('outbox: ')}", file=sys.stderr)
            return 2
        from outbox.service.process import ForcedExit

        if isinstance(exc, ForcedExit):
            print(f"{prog}: {exc}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, OutboxError):
            print(f"{prog}: {logs.redact(str(exc))}", file=sys.stderr)
            return 1
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if isinstance(exc, ImportError):
            raise exc from None  # main() names the extra that brings it
        raise
