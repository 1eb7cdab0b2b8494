"""Generic handler kinds an OutboxTopic can name in spec.handler: log, webhook, nats,
amqp, redis.

A kind builds a handler from the topic's spec.config (raising ValueError for
a config it cannot use) without any I/O, so the controller can validate a
config with the same code the relays run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from outbox.clock import Clock, system_clock
from outbox.handler import BuiltKind, Handler, HandlerKind, Kind
from outbox.handlers.amqp import KIND as AMQP
from outbox.handlers.jetstream import KIND as NATS
from outbox.handlers.streams import KIND as REDIS
from outbox.handlers.webhook import KIND as WEBHOOK
from outbox.message import Message

__all__ = [
    "AMQP",
    "KINDS",
    "LOG",
    "NATS",
    "REDIS",
    "WEBHOOK",
    "HandlerKinds",
    "LogKind",
    "log_handler",
]

log = logging.getLogger("outbox.handlers.log")


async def log_handler(m: Message) -> None:
    """Deliver a message by writing one log line about it (never its payload)."""
    log.info(
        "delivered message=%s topic=%s attempt=%d bytes=%d",
        m.id,
        m.topic,
        m.attempts,
        len(m.payload),
    )


class LogKind:
    """The ``log`` kind: takes no config; its handler writes one line a message."""

    def __call__(self, config: Mapping[str, Any], /) -> Handler:
        if config:
            raise ValueError(f"the log handler takes no config, got {sorted(config)}")
        return log_handler

    async def aclose(self) -> None:
        return None


LOG = Kind(name="log", build=lambda settings, clock: LogKind())

KINDS: tuple[Kind, ...] = (LOG, NATS, WEBHOOK, AMQP, REDIS)
"""Every handler kind an OutboxTopic may name. A new kind is one module that
declares its Kind, plus its line here (and its CRD field and chart values)."""


class HandlerKinds:
    """The kinds of one relay (or controller), built from KINDS, with what they share.

    ``settings`` are the kinds' loaded settings by kind name (a kind left out
    gets its defaults); outbox.service.settings.kind_settings() reads them all.
    """

    def __init__(self, *, clock: Clock = system_clock, **settings: Any) -> None:
        unknown = set(settings) - {kind.name for kind in KINDS}
        if unknown:
            raise TypeError(f"no handler kind named {sorted(unknown)}")
        self.built: dict[str, BuiltKind] = {
            kind.name: kind.build(settings.get(kind.name), clock) for kind in KINDS
        }
        self.mapping: dict[str, HandlerKind] = dict(self.built)

    async def aclose(self) -> None:
        """Close what the kinds share (the HTTP session, the NATS connection)."""
        for built in self.built.values():
            await built.aclose()
