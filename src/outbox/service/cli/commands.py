"""Parse the command line and run one command; errors a user can fix are one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from outbox.errors import ConfigError, NotFound, OutboxError, SchemaMissing
from outbox.service import logs
from outbox.service.cli import (
    buried,
    controller,
    env,
    keys,
    migrate,
    relay,
    relays,
    topics,
    ui,
)
from outbox.service.cli.common import Parser
from outbox.service.settings import ServiceSettings, config_error

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="outbox",
        description="Transactional outbox: relay messages from PostgreSQL to their handlers.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    formatter = argparse.RawDescriptionHelpFormatter
    for module in (relay, migrate, controller, buried, keys, topics, relays, ui, env):
        module.add(commands, formatter)
    return parser


def _one_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command (outbox.service.cli.main wraps it)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    prog = " ".join(["outbox", args.command, *([args.action] if "action" in args else [])])
    if extra:  # named by the command they were given to, not by `outbox`
        parser.exit(
            2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n"
        )
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BaseException as raw:
        exc = _one_error(raw)
        if "psycopg" in sys.modules:  # a database error from beside the store
            from outbox.postgres.errors import translated

            exc = translated(exc) or exc
        if isinstance(exc, ValidationError):
            exc = config_error(ServiceSettings, exc)
        if isinstance(exc, ConfigError | NotFound):
            print(f"{prog}: {str(exc).removeprefix('outbox: ')}", file=sys.stderr)
            return 2
        from outbox.service.process import ForcedExit

        if isinstance(exc, ForcedExit):
            print(f"{prog}: {exc}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, SchemaMissing):
            print(f"{prog}: OUTBOX_DATABASE_URL: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, OutboxError):
            print(f"{prog}: {logs.redact(str(exc))}", file=sys.stderr)
            return 1
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if isinstance(exc, ImportError):
            raise exc from None  # main() names the extra that brings it
        raise
