"""Generic handlers a relay can enable without application code."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from outbox.message import Message
from outbox.routing import Handler, HandlerKind

__all__ = ["KINDS", "log_handler"]

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


KINDS: dict[str, HandlerKind] = {"log": _log_kind}
"""Generic handler kinds an OutboxTopic can name in spec.handler."""
