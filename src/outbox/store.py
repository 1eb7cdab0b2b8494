"""The Store contract every backend fulfils (tests/contract proves it).

A message is *due* when it is not buried, its retry time has passed and its
lease, if any, has ended. Claims lease due messages; concurrent claims never
return the same message; a message whose relay crashed is claimed again when
its lease ends. Delivery is therefore at least once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from outbox.message import Message
from outbox.uow import UnitOfWork

__all__ = ["Store", "StoredMessage", "TopicSettings", "TopicStats", "check_claim"]

Tx = TypeVar("Tx")


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as the store holds it, with its delivery state."""

    message: Message
    due_at: dt.datetime
    """When it can next be claimed (while leased: when the lease ends)."""
    leased_until: dt.datetime | None
    """Set while a relay holds the message; a lease in the past has expired."""
    last_error: str | None
    buried_at: dt.datetime | None
    requeues: int = 0
    """Times an operator requeued it after it was buried."""
    requeued_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSettings:
    """One topic's entry in the registry: how relays deliver it.

    ``handler`` None means the topic's built-in handler; otherwise it names a
    built-in topic's handler or a generic handler kind (``log``), configured
    by ``config``. ``max_attempts`` and ``timeout`` None mean the OUTBOX_*
    defaults. ``source`` says who wrote it (``kubernetes:ns/name``, ``cli``).
    """

    topic: str
    enabled: bool = True
    handler: str | None = None
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_attempts: int | None = None
    timeout: dt.timedelta | None = None
    source: str | None = None
    updated_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic's backlog."""

    topic: str
    pending: int
    """Not buried: due, leased or waiting for a retry."""
    buried: int
    oldest_pending: dt.datetime | None
    """Creation time of the oldest message not buried."""


class Store(UnitOfWork[Tx], Protocol[Tx]):
    """Keeps messages until they are delivered."""

    async def add(self, tx: Tx, /, *msgs: Message) -> None:
        """Store ``msgs`` as part of ``tx``. Each becomes due at its ``created_at``."""
        ...

    async def claim(
        self,
        now: dt.datetime,
        lease: dt.timedelta,
        limit: int,
        *,
        exclude: Collection[str] = (),
    ) -> list[Message]:
        """Lease up to ``limit`` due messages, earliest due first, until ``now + lease``.

        Increments each message's attempts. Concurrent claims never return the
        same message. Messages of the topics in ``exclude`` (paused) are left.
        """
        ...

    async def ack(self, message_id: uuid.UUID) -> None:
        """Remove a delivered message. Raises NotFound if it is not there."""
        ...

    async def ack_many(self, message_ids: Sequence[uuid.UUID]) -> int:
        """Remove delivered messages in one round trip; return how many were there."""
        ...

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> None:
        """End the lease and make the message due again at ``at``, keeping ``reason``.

        Raises NotFound if it is not there.
        """
        ...

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> None:
        """Stop delivering a message and keep it, with ``reason``, for an operator.

        ``at`` is when it was buried (default: the wall clock). Raises NotFound
        if it is not there.
        """
        ...

    async def release(self, message_ids: Sequence[uuid.UUID], now: dt.datetime) -> int:
        """Hand leased messages back, due at ``now``, without counting the attempt.

        For a relay that stops before it could finish them, so another relay
        takes them without waiting for the lease to end. Buried or missing ids
        are skipped; returns how many were released.
        """
        ...

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        """Return a message with its delivery state. Raises NotFound if it is not there."""
        ...

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        since: dt.datetime | None = None,
        limit: int = 100,
    ) -> list[StoredMessage]:
        """Buried messages, newest first; of ``topic`` and buried at or after ``since``."""
        ...

    async def requeue(
        self,
        now: dt.datetime,
        *,
        ids: Sequence[uuid.UUID] | None = None,
        topic: str | None = None,
        dry_run: bool = False,
    ) -> list[uuid.UUID]:
        """Make buried messages due at ``now`` with attempts reset; return their ids.

        Only buried messages are touched, so it is idempotent. ``ids`` and
        ``topic`` narrow the selection; with neither, every buried message is
        requeued. The last error stays, and the requeue is counted.
        """
        ...

    async def purge_buried(
        self, before: dt.datetime, *, topic: str | None = None, dry_run: bool = False
    ) -> int:
        """Delete buried messages buried before ``before``; return how many."""
        ...

    async def topic_stats(self) -> list[TopicStats]:
        """Backlog per topic, in topic order."""
        ...

    async def topics(self) -> dict[str, TopicSettings]:
        """The topic registry, by topic."""
        ...

    async def set_topic(self, settings: TopicSettings, now: dt.datetime) -> None:
        """Create or replace one topic's registry entry."""
        ...

    async def delete_topic(self, topic: str) -> bool:
        """Remove a topic's entry; return whether there was one."""
        ...


def check_claim(lease: dt.timedelta, limit: int) -> None:
    """Reject claim arguments that can only be mistakes."""
    if lease <= dt.timedelta(0):
        raise ValueError(f"outbox: lease must be positive, got {lease}")
    if limit < 1:
        raise ValueError(f"outbox: limit must be at least 1, got {limit}")
