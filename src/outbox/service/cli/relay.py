"""`outbox relay`: one relay process, with probes, metrics and graceful shutdown."""

from __future__ import annotations

import argparse
import importlib
import logging
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from outbox.errors import ConfigError, first_line
from outbox.handlers import log_handler
from outbox.message import validate_topic
from outbox.relay import Handler
from outbox.service.cli.common import (
    service_settings,
    settings_help,
)
from outbox.service.settings import (
    KIND_SETTINGS,
    RelaySettings,
    ServiceSettings,
    SmtpSettings,
    kind_settings,
    load,
    relay_config,
)

log = logging.getLogger("outbox.service.cli")


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
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
        epilog=settings_help(ServiceSettings, RelaySettings, SmtpSettings, *KIND_SETTINGS),
        formatter_class=formatter,
    )
    relay.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from outbox.service.process import run_relay
    from outbox.tracing import configure_from_env

    settings = service_settings()
    config = relay_config()
    kind_settings()  # refused here, before anything starts; the process loads them again
    checks: list[Callable[[], bool]] = []
    handlers = _handlers(settings, checks)
    tracer = configure_from_env()  # OTEL_* (refused here, before anything starts)
    anyio.run(run_relay, settings, config, handlers, checks, tracer)
    return 0


def _handlers(settings: ServiceSettings, checks: list[Callable[[], bool]]) -> dict[str, Handler]:
    """The handlers this relay enables: the application's, then the log handler's topics.

    The SMTP server's state joins readiness (``checks``).
    """
    handlers: dict[str, Handler] = {}
    smtp = load(SmtpSettings)
    if smtp.enabled:
        from outbox.handlers.mail import SmtpSender, mail_handlers

        sender = SmtpSender(smtp)
        checks.append(lambda: sender.up)
        handlers.update(mail_handlers(smtp, sender=sender))
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
    """The mapping OUTBOX_HANDLERS names; any way it fails is a ConfigError naming it."""
    module_name, _, attribute = spec.partition(":")
    try:
        found: Any = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # the module itself may raise anything while importing
        raise ConfigError("OUTBOX_HANDLERS", f"cannot load {spec}: {first_line(exc)}") from None
    if callable(found) and not isinstance(found, Mapping):
        try:
            found = found()
        except Exception as exc:
            raise ConfigError(
                "OUTBOX_HANDLERS", f"{spec} raised while making the handlers: {first_line(exc)}"
            ) from None
    if not isinstance(found, Mapping) or not all(callable(h) for h in found.values()):
        raise ConfigError("OUTBOX_HANDLERS", f"{spec} is not a mapping of topic to handler")
    for topic in found:
        try:
            validate_topic(topic)
        except (TypeError, ValueError) as exc:
            reason = str(exc).removeprefix("outbox: ")
            raise ConfigError("OUTBOX_HANDLERS", f"{spec} maps a bad topic: {reason}") from None
    return found
