"""Generic handlers a relay can enable without application code."""

from __future__ import annotations

import logging

from outbox.message import Message

__all__ = ["log_handler"]

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
