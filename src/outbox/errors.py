"""The exceptions outbox raises and the ones handlers raise to steer the relay.

Everything the package raises on purpose derives from :class:`OutboxError`.
A handler raises :class:`Permanent` to bury a message at once; any other
exception makes the relay retry it later.
"""

from __future__ import annotations

import datetime as dt
import uuid

__all__ = [
    "ConfigError",
    "Dropped",
    "EncodeError",
    "MigrationBlocked",
    "MigrationRefused",
    "NotFound",
    "NotInTransaction",
    "NotPermitted",
    "OutboxError",
    "PayloadMismatch",
    "Permanent",
    "QueryTooBroad",
    "RetryAfter",
    "SchemaMissing",
    "StoreError",
    "StoreUnavailable",
    "Unavailable",
    "first_line",
]


class OutboxError(Exception):
    """Root of the exceptions this package raises."""


class EncodeError(OutboxError, ValueError):
    """A payload could not be encoded as JSON."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"outbox: encode {topic}: {reason}")
        self.topic = topic
        self.reason = reason


class NotFound(OutboxError, LookupError):
    """No message with this id is in the store."""

    def __init__(self, message_id: uuid.UUID) -> None:
        super().__init__(f"outbox: message {message_id} not found")
        self.message_id = message_id


class Permanent(OutboxError):
    """Raised by a handler: retrying cannot help, bury the message now.

    A mail server that answers 550 for an unknown mailbox will answer the same
    in five minutes; trying eight times only delays the operator's alert.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PayloadMismatch(Permanent):
    """A message's payload does not fit the model a handler decodes it into.

    Permanent: the relay buries the message with this reason at once.
    """

    def __init__(self, topic: str, model: str, reason: str) -> None:
        super().__init__(f"payload of {topic} does not fit {model}: {reason}")
        self.topic = topic
        self.model = model


class NotInTransaction(OutboxError):
    """A message was added through a connection outside any transaction.

    It would commit on its own, apart from the change it announces: the bug
    the outbox exists to prevent. Nothing was stored.
    """

    def __init__(self, where: str) -> None:
        super().__init__(
            f"outbox: {where} is not inside a transaction; add messages in the transaction "
            "of the change they announce (nothing was stored)"
        )


class RetryAfter(OutboxError):
    """Raised by a handler: retry, but not before ``delay`` (a receiver's Retry-After).

    The attempt still counts towards max_attempts.
    """

    def __init__(self, delay: dt.timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Unavailable(OutboxError):
    """Raised by a handler: the receiving side is down or misconfigured, not the message.

    A mail server that refuses the relay's login, a TLS handshake that fails, a
    server that answers 421 on connect: every message would fail the same way.
    The relay retries after ``delay`` without counting the attempt, so nothing
    is buried while an operator fixes the server or the credentials.
    """

    def __init__(self, delay: dt.timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Dropped(OutboxError):
    """Raised by a handler: this message no longer needs delivering; ack it unsent.

    A sign-in link that expired before its email went out would only fail; the
    relay acks it and counts it in outbox_dropped_total{topic,reason}.
    ``reason`` is a short label (``expired``), used as a metric label.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConfigError(OutboxError, ValueError):
    """A setting is missing or invalid. ``variable`` names it (``OUTBOX_LEASE``)."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.variable = variable
        self.reason = reason


class StoreUnavailable(OutboxError):
    """The store cannot be reached now (connection refused, lost, pool exhausted).

    Transient by nature: the relay logs it and tries again with a capped backoff.
    """


class StoreError(OutboxError):
    """A statement of the store failed in the database for a reason other than the
    connection (StoreUnavailable): a missing privilege, a constraint, a bad value.

    Its message is the server's first line, which never quotes a password.
    """


class NotPermitted(StoreError):
    """The database role may not do what a statement asked (a missing grant):
    a read-only operator console's change, say."""


class QueryTooBroad(StoreError):
    """An operator's listing ran out of its time: the filter matches too little
    of too much (narrow it: a topic, a state, a key)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"outbox: the listing read for {seconds:g}s without filling its page: narrow the "
            "filter (a topic, a state, a key)"
        )


class SchemaMissing(StoreError):
    """The outbox's tables or columns are not there (or not all): run ``outbox migrate``."""


class MigrationBlocked(OutboxError):
    """A migration could not take its lock in time; nothing of it was applied.

    ``blockers`` describes the sessions that held it (pid, state, age).
    """

    def __init__(self, what: str, waited: float, blockers: str) -> None:
        super().__init__(
            f"{what}: gave up after {waited:.0f}s waiting for a lock"
            + (f" held by {blockers}" if blockers else "")
            + "; end that session (or wait for it) and run migrate again"
        )
        self.blockers = blockers


class MigrationRefused(OutboxError):
    """A migration found outbox objects it must not adopt; nothing of it was applied."""


def first_line(exc: BaseException, *, typed: bool = True) -> str:
    """``Type: first line of the message`` (with ``typed`` False, the line alone):
    what a log line or a reason says of ``exc``; its type when it says nothing."""
    text = str(exc).strip().splitlines()
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text[0]}" if typed else text[0]
