"""outbox: a transactional outbox for Python and PostgreSQL.

Add a message in the same transaction as the change it announces; a relay
delivers it at least once, retrying with backoff and burying what keeps
failing. Handlers must make repeats harmless.
"""

from __future__ import annotations

from outbox import uow
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
)
from outbox.message import Message, new_message
from outbox.relay import Clock, Handler, Relay, backoff, system_clock
from outbox.settings import RelayConfig
from outbox.store import Store, StoredMessage

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
    "backoff",
    "new_message",
    "system_clock",
    "uow",
]
