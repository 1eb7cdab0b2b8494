"""What the commands share: the one-line usage errors, argument types, settings help, stores."""

from __future__ import annotations

import argparse
import datetime as dt
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

import anyio
from pydantic_settings import BaseSettings

from outbox.durations import parse_duration
from outbox.errors import ConfigError
from outbox.message import loads_strict, validate_topic
from outbox.postgres import PostgresStore, connect_pool
from outbox.service import admin, logs
from outbox.service.settings import ServiceSettings, load, variables

DATABASE = ("OUTBOX_DATABASE_URL", "OUTBOX_DATABASE_SCHEMA", "OUTBOX_DATA_DIR")
LOGS = ("OUTBOX_LOG_LEVEL", "OUTBOX_LOG_FORMAT")


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def settings_help(*models: type[BaseSettings], only: Sequence[str] = ()) -> str:
    rows = [r for r in variables(*models) if not only or r[0] in only]
    width = max(len(r[0]) for r in rows)
    lines = ["settings (environment variables):"]
    for name, default, description in rows:
        text = f"{description} Default: {default}."
        wrapped = textwrap.wrap(text, 78 - width - 4) or [""]
        lines.append(f"  {name:<{width}}  {wrapped[0]}")
        lines.extend(f"  {'':<{width}}  {more}" for more in wrapped[1:])
    return "\n".join(lines)


def duration(text: str) -> dt.timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def message_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a message id (a UUID)") from None


def topic(text: str) -> str:
    try:
        return validate_topic(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("outbox: ")) from None


def force_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help=(
            "act on an entry an OutboxTopic governs: a change is an override the controller "
            "leaves alone; deleting it hands the topic back to the resource"
        ),
    )


def embedded_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="without OUTBOX_DATABASE_URL, use the local embedded PostgreSQL (OUTBOX_DATA_DIR)",
    )


def optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type that also takes ``default`` (clear the override)."""

    def parse_or_default(text: str) -> Any:
        return admin.DEFAULT if text == "default" else parse(text)

    return parse_or_default


def json_object(text: str) -> dict[str, Any]:
    try:
        value = loads_strict(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not usable JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def positive_duration(text: str) -> dt.timedelta:
    value = duration(text)
    if value <= dt.timedelta(0):
        raise argparse.ArgumentTypeError("must be longer than 0s")
    return value


def attempts(text: str) -> int:
    return positive(text, most=1000)


def positive(text: str, most: int = 1_000_000) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    if value > most:
        raise argparse.ArgumentTypeError(f"must be at most {most}")
    return value


def with_store(work: Callable[[PostgresStore], Awaitable[object]], args: argparse.Namespace) -> int:
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
    hide_secrets(settings)

    async def run() -> None:
        async with database(settings) as url, connect_pool(url, max_size=2) as pool:
            await work(PostgresStore(pool))

    anyio.run(run)
    return 0


def service_settings() -> ServiceSettings:
    settings = load(ServiceSettings)
    logs.configure(settings.log_level, settings.log_format)
    hide_secrets(settings)
    return settings


def hide_secrets(settings: ServiceSettings) -> None:
    """Register every secret the settings hold with the log redaction."""
    from psycopg.conninfo import conninfo_to_dict

    from outbox.handlers import KINDS
    from outbox.service.settings import SmtpSettings

    for secret in (settings.database_url, settings.listen_url):
        if secret is None:
            continue
        url = secret.get_secret_value()
        try:
            params = conninfo_to_dict(url)
            logs.hide(str(params.get("password") or ""))
            if "@" in str(params.get("host") or ""):  # the tail of a password with an @
                logs.hide(str(params["host"]))
        except Exception:  # unparseable: the start-up check says so without quoting it
            logs.hide(*url.split())
    # The built-in mail topics' SMTP settings, then every handler kind's (its Kind
    # says which fields are secrets; tests/unit/test_kinds.py keeps that whole).
    owners: list[tuple[type[Any], tuple[str, ...]]] = [(SmtpSettings, ("password",))]
    for kind in KINDS:
        if kind.settings is not None and kind.secrets:
            owners.append((kind.settings, kind.secrets))
    for model, fields in owners:
        try:
            loaded = load(model)
        except ConfigError:
            continue  # reported where the settings are used
        for name in fields:
            value = getattr(loaded, name)
            logs.hide(value.get_secret_value() if value is not None else None)
