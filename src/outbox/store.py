"""The Store contract every backend fulfils (tests/contract proves it).

A message is *due* when it is not buried, its due time has passed and its
lease, if any, has ended. A lease does not move the due time: a message whose
relay died is claimed again in its old place in line. Claims lease due
messages; concurrent claims never return the same message; a message whose
relay crashed is claimed again when its lease ends. Delivery is therefore at
least once.

Every claim gives what it leases a fresh lease token (``Message.lease``). A
write-back that carries the token (retry, bury, release) applies only while
the row still carries it, so a relay that stalled past its lease can change
nothing the current holder does. A bare id is an operator's unfenced write.

Time is the store's own (the database's ``now()``; MemoryStore's clock): the
``now`` arguments exist for tests that drive an injected clock, and relays
pass durations, so a relay with a skewed clock cannot move a lease.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

from outbox.keys import BLOCKED_SCAN, BlockedKey
from outbox.message import Message
from outbox.records import RelayInfo, StorageHealth, StoredMessage, TopicSettings, TopicStats
from outbox.requests import (
    Acked,
    Buried,
    BuriedCount,
    BuriedFilter,
    Claimed,
    ClaimRequest,
    MessageQuery,
    Orphans,
    Outcome,
    Released,
    Retried,
    Settled,
    check_claim,
)
from outbox.uow import UnitOfWork

SWEEP_BATCH = 5_000
"""Messages one statement of a bulk write (sweep, requeue, purge) changes at most."""
SWEEP_BUDGET = 250_000
"""Messages one unserved sweep buries at most; the next sweep goes on."""


__all__ = [
    "BLOCKED_SCAN",
    "SWEEP_BATCH",
    "SWEEP_BUDGET",
    "Acked",
    "BlockedKey",
    "Buried",
    "BuriedCount",
    "BuriedFilter",
    "ClaimRequest",
    "Claimed",
    "MessageQuery",
    "Operator",
    "Orphans",
    "Outcome",
    "Producer",
    "Registry",
    "RelayInfo",
    "RelayStore",
    "Released",
    "Retried",
    "Settled",
    "StorageHealth",
    "Store",
    "StoredMessage",
    "TopicSettings",
    "TopicStats",
    "check_claim",
    "message_ids",
]

Tx = TypeVar("Tx")
Tx_contra = TypeVar("Tx_contra", contravariant=True)


class Producer(Protocol[Tx_contra]):
    """What an application needs to add messages in its own transactions."""

    async def add(self, tx: Tx_contra, /, *msgs: Message) -> None:
        """Store ``msgs`` as part of ``tx``. Each becomes due at its ``created_at``."""
        ...


class RelayStore(Protocol):
    """What a relay needs: claims, fenced write-backs, the fleet table, the registry."""

    async def wakeups(self, wake: Callable[[frozenset[str] | None], None]) -> None:
        """Call ``wake(topics)`` (None: any topic) as messages are committed, until
        cancelled; a store with no such signal just waits (the relay polls)."""
        ...

    async def claim(
        self, now: dt.datetime | None, lease: dt.timedelta, limit: int
    ) -> list[Message]:
        """The design's claim: lease up to ``limit`` due messages, earliest due
        first, for ``lease`` (``claim_many`` of ``ClaimRequest(limit, lease, now)``).

        Each claimed message gets a fresh lease token and one more attempt.
        Concurrent claims never return the same message; of the messages that
        share a key only the key's head is claimed. ``now`` None is the
        store's time.
        """
        ...

    async def claim_many(self, request: ClaimRequest) -> Claimed:
        """Lease what ``request`` asks for (see ClaimRequest and Orphans)."""
        ...

    async def settle(
        self, outcomes: Sequence[Outcome], *, now: dt.datetime | None = None
    ) -> Settled:
        """Write a relay's outcomes (acks first) and return the ids written per outcome.

        One call a round: what a relay's deliveries decided since its last
        write. Retries, burials, releases and keyed acks are fenced by each
        message's lease token; see the outcome records for what each needs.
        A call that raises wrote nothing on a store that can say so
        (PostgreSQL writes a mixed settlement in one transaction).
        """
        ...

    async def ack_many(
        self,
        message_ids: Sequence[uuid.UUID],
        *,
        tokens: Collection[uuid.UUID] | None = None,
        keyed: bool = True,
        durable: bool = True,
    ) -> set[uuid.UUID]:
        """Remove delivered messages in one round trip; return the ids removed
        (with ``keyed`` False and no ``tokens``: the ids given, unchecked).

        A message without a key is not fenced: once delivered it needs no more
        delivery, whoever holds it. A keyed one is removed only while one of
        the leases ``tokens`` (the caller's; None: any) holds it, so a relay
        that stalled past its lease cannot end the current holder's delivery
        of a key's message early (letting the next start beside it).
        The next message of each key removed, if a claim parked it behind the
        removed one, is unparked in the same transaction. ``keyed`` False: the
        caller knows none of them needs unparking behind it (none has a key,
        or the caller holds each one's next message; without ``tokens``, none
        has a key). ``durable`` False (a run's acks, with ``keyed`` False):
        the store may answer before the removal is flushed to disk, so a crash
        of the database itself (never of a relay) may undo the last ones; they
        are then delivered again, in order.
        """
        ...

    async def retry_many(
        self,
        items: Sequence[tuple[Message, dt.timedelta, str]],
        *,
        now: dt.datetime | None = None,
        uncounted: Collection[uuid.UUID] = (),
    ) -> set[uuid.UUID]:
        """Make each (message, delay, reason) due again after delay, keeping reason.

        Fenced by each message's lease token; returns the ids written. The
        others lost their lease (another claim took them, or they are gone).
        Messages in ``uncounted`` get their attempt back (the receiver failed).
        """
        ...

    async def bury_many(
        self, items: Sequence[tuple[Message, str]], *, now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        """Bury each (message, reason), fenced by its lease token; return the ids written."""
        ...

    async def release(
        self, messages: Sequence[Message], now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        """Hand leased messages back, due at once, without counting the attempt.

        For a relay that stops before it could finish them, so another relay
        takes them without waiting for the lease to end. Each is fenced by the
        lease it carries; buried or missing ones are skipped. Returns the ids
        released.
        """
        ...

    async def register_relay(
        self, relay: RelayInfo, ttl: dt.timedelta, *, now: dt.datetime | None = None
    ) -> dt.datetime:
        """Record or refresh ``relay``, live for ``ttl``; return the store's time."""
        ...

    async def unregister_relay(self, relay_id: uuid.UUID) -> None:
        """Remove a relay that exits cleanly."""
        ...

    async def relays(self, *, now: dt.datetime | None = None) -> list[RelayInfo]:
        """The live relays, oldest first."""
        ...

    async def rotate(self, *, now: dt.datetime | None = None) -> int:
        """Return the space of what was settled: empty the storage that no longer
        takes new messages once nothing in it waits, moving what does wait
        (once) where it can stay; return how many messages were moved. A
        relay calls it every interval; ``now`` (tests) decides which leases
        ended. A store that frees space at once does nothing."""
        ...

    async def bury_unserved(
        self,
        grace: dt.timedelta,
        *,
        now: dt.datetime | None = None,
        batch: int = SWEEP_BATCH,
        budget: int = SWEEP_BUDGET,
    ) -> dict[str, int]:
        """Bury due messages of topics nobody has served for ``grace``; count them by topic.

        A topic is unserved while no live relay serves it and it has no
        registry entry (a paused or bound topic waits for its relays). The
        store notes since when; a topic noted now is buried by a later call.
        Burials go in batches of ``batch``, each committed, at most ``budget``
        in one call (the next call goes on): a typo'd topic of millions never
        becomes one statement, and the caller never holds a row per message.
        """
        ...

    async def topics(self) -> dict[str, TopicSettings]:
        """The topic registry, by topic."""
        ...


class Operator(Protocol):
    """What an operator's tools need: inspect, requeue and purge; the backlog.

    ``ack``, ``retry`` and ``bury`` by id are the design's own operations: an
    operator's (or a simple relay's) writes, unfenced, NotFound for an id that
    is not there. A relay of this package writes back through the fenced
    ``*_many`` operations and ``release``, whose Messages carry their lease.
    """

    async def ack(self, message_id: uuid.UUID) -> None:
        """Remove a delivered message, whoever holds it.

        The next message of its key, if a claim parked it behind this one, is
        unparked with it (as the relay's ack does). NotFound if it is not there.
        """
        ...

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> bool:
        """End any lease and make the message due again at ``at``, keeping ``reason``.

        An operator's write: unfenced, NotFound if the message is not there.
        A relay writes back through retry_many, bury_many and release, whose
        Messages carry their lease: fencing is the API's, not the caller's.
        """
        ...

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> bool:
        """Stop delivering a message and keep it, with ``reason``, for an operator.

        ``at`` is when it was buried (default: the store's time). Unfenced,
        like :meth:`retry`. Where its topic skips past buried messages, the
        next message of its key is unparked (as the relay's burial does).
        """
        ...

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        """Return a message with its delivery state. Raises NotFound if it is not there."""
        ...

    async def list_messages(self, query: MessageQuery) -> list[StoredMessage]:
        """The page of messages ``query`` asks for, in the order of their ids.
        Payloads are not read (``size`` says how large each is). A listing
        that reads too long without filling its page raises QueryTooBroad."""
        ...

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        within: dt.timedelta | None = None,
        limit: int = 100,
        now: dt.datetime | None = None,
    ) -> list[StoredMessage]:
        """Buried messages, newest first; of ``topic`` and buried within ``within``.

        Payloads are not read (``message.payload`` is empty; ``size`` says how
        large it is): ``get`` reads one message whole.
        """
        ...

    async def keys_blocked(self, *, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        """Keys of ``topic`` (None: any) whose waiting messages are held by a head
        that is buried (where its topic blocks) or has failed; longest blocked first."""
        ...

    async def count_buried(
        self, selection: BuriedFilter, *, now: dt.datetime | None = None
    ) -> BuriedCount:
        """How many buried messages ``selection`` selects, and when the newest of
        them was buried: a requeue or purge of the same selection with
        ``buried_by`` set to it acts on these (fewer, if some went meanwhile)."""
        ...

    async def requeue(
        self,
        *,
        ids: Sequence[uuid.UUID] | None = None,
        topic: str | None = None,
        dry_run: bool = False,
        now: dt.datetime | None = None,
        batch: int = SWEEP_BATCH,
        selection: BuriedFilter | None = None,
    ) -> int:
        """Make buried messages due now with attempts reset; return how many.

        Only buried messages are touched, so it is idempotent. ``ids`` and
        ``topic``, or a ``selection`` (not both), narrow what is requeued; with
        none, every buried message is. The last error stays, and the requeue
        is counted. Among a key's messages, order is kept (each waits for the
        one before it). Works in batches of ``batch``, each committed; a dry
        run only counts.
        """
        ...

    async def purge_buried(
        self,
        older_than: dt.timedelta | None = None,
        *,
        topic: str | None = None,
        dry_run: bool = False,
        now: dt.datetime | None = None,
        batch: int = SWEEP_BATCH,
        selection: BuriedFilter | None = None,
    ) -> int:
        """Delete messages buried longer than ``older_than`` ago, or those
        ``selection`` selects (one of the two: ValueError with neither);
        return how many. Batches of ``batch``, each committed; a dry run only
        counts.
        """
        ...

    async def topic_stats(
        self, *, max_age: dt.timedelta | None = None, blocked: bool = True
    ) -> list[TopicStats]:
        """Backlog per topic, in topic order, with each topic's blocked keys.

        With ``max_age``, a measurement another process took within that age
        may be returned instead: counting reads every row, so a fleet shares
        one count per ``max_age`` rather than each relay counting for itself.
        ``blocked`` False: a count of its own reads no key column (the
        controller's grant) and leaves blocked_keys None; a shared
        measurement still has them.
        """
        ...

    async def relays(self, *, now: dt.datetime | None = None) -> list[RelayInfo]:
        """The live relays, oldest first."""
        ...

    async def storage(self) -> StorageHealth:
        """What the storage holds (dead rows, bytes) and the oldest snapshot that
        keeps it from being vacuumed; read from the database's statistics views,
        never by scanning the messages."""
        ...


class Registry(Protocol):
    """What the controller and `outbox topics` need: the topic registry."""

    async def backlog_measurement(self) -> tuple[dt.datetime, list[TopicStats]] | None:
        """The relays' last shared backlog measurement and when it was taken
        (``topic_stats`` with ``max_age`` keeps it), without counting anything:
        None when none was ever kept. In-flight counts are read fresh."""
        ...

    async def topics(self) -> dict[str, TopicSettings]:
        """The topic registry, by topic."""
        ...

    async def may_change(self) -> bool:
        """Whether this store's own access may requeue, purge and set topics (a
        read-only console's database role may not: its pages offer no changes)."""
        ...

    async def set_topic(self, settings: TopicSettings, now: dt.datetime | None = None) -> None:
        """Create or replace one topic's registry entry."""
        ...

    async def govern_topic(
        self, settings: TopicSettings, now: dt.datetime | None = None
    ) -> str | None:
        """Write an OutboxTopic's entry unless an older resource governs its topic.

        ``settings.source`` names the resource and ``settings.owner_since`` is
        its creation time; the oldest (then the lowest source) wins, decided
        in one statement. Entries of ``outbox topics`` never give way (a
        Conflict for the operator to resolve). Returns the
        source that governs the topic afterwards.
        """
        ...

    async def delete_topic(self, topic: str) -> bool:
        """Remove a topic's entry; return whether there was one."""
        ...


class Store(UnitOfWork[Tx], Producer[Tx], RelayStore, Operator, Registry, Protocol[Tx]):
    """Keeps messages until they are delivered: every role's part, on one backend.

    An application type-checks against the small part it uses (Producer for
    code that only adds messages; RelayStore, Operator, Registry for the
    rest); the backends implement all of it and tests/contract proves they
    agree.
    """


def message_ids(messages: Sequence[Message]) -> tuple[list[uuid.UUID], list[uuid.UUID | None]]:
    """Ids and lease tokens of ``messages`` (None for a message never claimed)."""
    return [m.id for m in messages], [m.lease for m in messages]
