"""Generic handler kinds an OutboxTopic can name in spec.handler: log, webhook, nats.

A kind builds a handler from the topic's spec.config (raising ValueError for
a config it cannot use) without any I/O, so the controller can validate a
config with the same code the relays run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from outbox.clock import Clock, system_clock
from outbox.handler import Handler, HandlerKind
from outbox.handlers.jetstream import NatsKind
from outbox.handlers.settings import NatsSettings, WebhookSettings
from outbox.handlers.webhook import WebhookKind
from outbox.message import Message

__all__ = ["HandlerKinds", "log_handler"]

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


def _log_kind(config: Mapping[str, Any]) -> Handler:
    if config:
        raise ValueError(f"the log handler takes no config, got {sorted(config)}")
    return log_handler


class HandlerKinds:
    """The kinds of one relay (or controller), with the connections they share."""

    def __init__(
        self,
        *,
        clock: Clock = system_clock,
        nats: NatsSettings | None = None,
        webhook: WebhookSettings | None = None,
    ) -> None:
        allowed = webhook.prefixes() if webhook else []
        self.webhook = WebhookKind(clock, allowed)
        self.nats = NatsKind(nats or NatsSettings.model_validate({}))
        self.mapping: dict[str, HandlerKind] = {
            "log": _log_kind,
            "webhook": self.webhook,
            "nats": self.nats,
        }

    async def aclose(self) -> None:
        """Close the HTTP session and the NATS connection."""
        await self.webhook.aclose()
        await self.nats.aclose()
