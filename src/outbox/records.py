"""What the store hands back besides messages: a stored message's delivery
state, registry entries, a topic's backlog, a relay as the fleet sees it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from outbox.message import Message

__all__ = ["RelayInfo", "StorageHealth", "StoredMessage", "TopicSettings", "TopicStats"]


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as the store holds it, with its delivery state."""

    message: Message
    due_at: dt.datetime
    """Its place in line: due from then on, once no lease holds it."""
    leased_until: dt.datetime | None
    """Set while a relay holds the message; a lease in the past has expired."""
    last_error: str | None
    buried_at: dt.datetime | None
    requeues: int = 0
    """Times an operator requeued it after it was buried."""
    requeued_at: dt.datetime | None = None
    size: int | None = None
    """Bytes of the payload, when the payload itself was not read (list_buried)."""

    parked: bool = False
    """It waits behind an earlier message of its key (no lease holds it)."""

    def state(self, now: dt.datetime) -> str:
        """Where it is at ``now`` (the store's time): one of requests.MESSAGE_STATES."""
        if self.buried_at is not None:
            return "buried"
        if self.parked:
            return "parked"
        if self.leased_until is not None:
            return "in_flight"
        return "pending" if self.due_at <= now else "due_later"


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
    max_in_flight: int | None = None
    """At most this many deliveries of the topic in flight in one relay (None: no cap)."""
    source: str | None = None
    updated_at: dt.datetime | None = None
    owner_since: dt.datetime | None = None
    """Creation time of the OutboxTopic that governs the entry (None: not a resource)."""
    on_buried: str | None = None
    """What a buried message does to the later ones of its key: ``block`` (None,
    the default: they wait until it is requeued or purged) or ``skip``."""
    reroute: bool = False
    """Whether the entry's source may send a topic that has a built-in or
    application handler to a handler kind instead: an operator's entry may,
    an OutboxTopic only with a grant that says ``:reroute``. A relay never
    lets an entry without it replace a handler of its own."""


@dataclasses.dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic's backlog."""

    topic: str
    pending: int
    """Not buried: due, leased or waiting for a retry."""
    buried: int
    oldest_pending: dt.datetime | None
    """Creation time of the oldest message not buried."""
    blocked_keys: int | None = 0
    """Keys whose messages wait behind a buried or failing head (keys_blocked);
    None: not measured (a count taken without the key columns)."""
    oldest_blocked: dt.datetime | None = None
    """When the longest of those blocks began."""
    in_flight: int | None = None
    """Of ``pending``, those a lease holds (an orphan's lease has ended); None:
    not measured (a count taken without the lease column, an earlier
    release's)."""
    due_later: int | None = None
    """Of ``pending``, those waiting for a later due time (a retry's backoff, a
    delay) under no lease; None: not measured (a relay of an earlier release
    measured)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StorageHealth:
    """What the outbox's storage holds, and what holds it back (Operator.storage)."""

    oldest_snapshot_seconds: float
    """Age of the oldest snapshot holding this database's horizon back, of the
    sessions (and prepared transactions) the role can see; 0 when none is."""
    oldest_snapshot_transactions: int
    """The same in transactions, of every holder the role can see, replication
    slots and standbys' feedback included."""
    dead_rows: int
    """Dead row versions in the outbox's tables, as the statistics last counted."""
    size_bytes: int
    """The outbox's tables with their indexes and TOAST."""


@dataclasses.dataclass(frozen=True, slots=True)
class RelayInfo:
    """One running relay process as the fleet sees it."""

    id: uuid.UUID
    host: str
    """Pod name (POD_NAME) or host name."""
    pid: int
    version: str
    topics: tuple[str, ...]
    """The topics it can deliver (paused ones included)."""
    kinds: tuple[str, ...]
    """The handler kinds it has (log, webhook, nats)."""
    started_at: dt.datetime | None = None
    seen_at: dt.datetime | None = None
    expires_at: dt.datetime | None = None
    """Once past, the relay no longer counts as live (it died or stalled)."""
    handlers: tuple[str, ...] = ()
    """The topics it has a built-in or application handler for (among ``topics``)."""
