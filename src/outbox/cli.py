"""The ``outbox`` command: the composition root, from settings to a running process.

Errors a user can fix (a bad setting, an unreachable database) end as one line
on stderr and a non-zero exit: 2 for configuration and usage, 1 for the rest.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import anyio
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from outbox import logs
from outbox.errors import ConfigError, OutboxError
from outbox.handlers import log_handler
from outbox.relay import Handler
from outbox.settings import (
    RelayConfig,
    ServiceSettings,
    SmtpSettings,
    config_error,
    load,
    variables,
)

__all__ = ["main"]

log = logging.getLogger("outbox.cli")

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
        epilog=_settings_help(ServiceSettings, RelayConfig, SmtpSettings),
        formatter_class=formatter,
    )
    relay.set_defaults(func=_relay)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox schema, then exit",
        description="Apply the schema migrations the database lacks. Safe from several pods.",
        epilog=_settings_help(ServiceSettings, only=_DATABASE + _LOGS),
        formatter_class=formatter,
    )
    migrate.set_defaults(func=_migrate)

    demo = commands.add_parser(
        "demo",
        help="a short tour on the embedded PostgreSQL",
        description="Add messages with a change and relay them, on an embedded PostgreSQL.",
        epilog=_settings_help(ServiceSettings, only=("OUTBOX_DATA_DIR",)),
        formatter_class=formatter,
    )
    demo.set_defaults(func=_demo)

    env = commands.add_parser(
        "env",
        help="list every OUTBOX_* variable with its default",
        description="List every OUTBOX_* setting, its default and what it does.",
    )
    env.add_argument("--markdown", action="store_true", help="as a Markdown table")
    env.set_defaults(func=_env)
    return parser


def _service_settings() -> ServiceSettings:
    settings = load(ServiceSettings)
    logs.configure(settings.log_level, settings.log_format)
    return settings


def _relay(args: argparse.Namespace) -> int:
    from outbox.service import run_relay

    settings = _service_settings()
    config = load(RelayConfig)
    handlers = _handlers(settings)
    anyio.run(run_relay, settings, config, handlers)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from outbox.postgres import migrate
    from outbox.service import database

    settings = _service_settings()

    async def run() -> list[int]:
        async with database(settings, migrate_embedded=False) as url:
            return await migrate(url)

    applied = anyio.run(run)
    log.info("schema up to date; applied %s", applied or "nothing")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from outbox.demo import main as demo

    return demo()


def _env(args: argparse.Namespace) -> int:
    rows = variables(ServiceSettings, RelayConfig, SmtpSettings)
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
        from outbox.user.mail import mail_handlers

        handlers.update(mail_handlers(smtp))
    if settings.handlers:
        for topic, handler in _import_handlers(settings.handlers).items():
            handlers[topic] = handler  # the application's own win over built-in ones
    for topic in settings.topics_to_log():
        if topic in handlers:
            raise ConfigError("OUTBOX_LOG_TOPICS", f"{topic} already has a handler")
        handlers[topic] = log_handler
    if not handlers:
        raise ConfigError(
            "OUTBOX_HANDLERS",
            "no handlers enabled; a relay without them would bury every message it claims "
            "(set OUTBOX_SMTP_HOST, OUTBOX_HANDLERS=module:attribute or OUTBOX_LOG_TOPICS)",
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outbox`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    prog = f"outbox {args.command}"
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BaseException as raw:
        exc = _one_error(raw)
        if isinstance(exc, ValidationError):
            exc = config_error(ServiceSettings, exc)
        if isinstance(exc, ConfigError):
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        from outbox.service import ForcedExit

        if isinstance(exc, ForcedExit):
            print(f"{prog}: {exc}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, OutboxError):
            print(f"{prog}: {logs.redact(str(exc))}", file=sys.stderr)
            return 1
        if isinstance(exc, KeyboardInterrupt):
            return 130
        raise


if __name__ == "__main__":
    sys.exit(main())
