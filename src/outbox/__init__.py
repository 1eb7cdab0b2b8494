"""outbox: a transactional outbox for Python and PostgreSQL.

Add a message in the same transaction as the change it announces; a relay
delivers it at least once, retrying with backoff and burying what keeps
failing. Handlers must make repeats harmless.

``import outbox`` is light (what a producer needs: messages and errors); the
relay and its configuration load on first use (the ``relay`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.clock import Clock, system_clock
from outbox.errors import (
    ConfigError,
    Dropped,
    EncodeError,
    NotFound,
    NotInTransaction,
    OutboxError,
    PayloadMismatch,
    Permanent,
    RetryAfter,
    StoreUnavailable,
    Unavailable,
)
from outbox.lazy import loader
from outbox.message import Message, new_message
from outbox.store import Store, StoredMessage

if TYPE_CHECKING:
    from outbox import uow
    from outbox.relay import Handler, Relay, backoff
    from outbox.relay.config import RelayConfig

__all__ = [
    "Clock",
    "ConfigError",
    "Dropped",
    "EncodeError",
    "Handler",
    "Message",
    "NotFound",
    "NotInTransaction",
    "OutboxError",
    "PayloadMismatch",
    "Permanent",
    "Relay",
    "RelayConfig",
    "RetryAfter",
    "Store",
    "StoreUnavailable",
    "StoredMessage",
    "Unavailable",
    "backoff",
    "new_message",
    "system_clock",
    "uow",
]

__getattr__ = loader(
    __name__,
    {
        "Handler": "outbox.relay",
        "Relay": "outbox.relay",
        "backoff": "outbox.relay",
        "RelayConfig": "outbox.relay.config",
        "uow": None,
    },
)
