"""What a relay asks of a store, and what the store answers: records, not flags.

A claim is one :class:`ClaimRequest` answered by one :class:`Claimed`; a
settlement is a list of outcome values (:class:`Acked`, :class:`Retried`,
:class:`Buried`, :class:`Released`) answered by one :class:`Settled`. The
relay decides what to ask (its policy); each backend maps a request to its
statements in one place (``claim_many`` and ``settle``). A new claim policy is
a field here, the relay's use of it and each backend's mapping.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Collection, Mapping, Sequence

from outbox.message import Message

__all__ = [
    "MAX_ERROR_TEXT",
    "MAX_LISTING",
    "MESSAGE_STATES",
    "Acked",
    "Buried",
    "BuriedCount",
    "BuriedFilter",
    "ClaimRequest",
    "Claimed",
    "MessageQuery",
    "Orphans",
    "Outcome",
    "Released",
    "Retried",
    "Settled",
    "buried_selection",
    "check_claim",
]


class Orphans(enum.Enum):
    """What a claim does with orphans: due messages whose earlier lease ran out
    unsettled (their relay died or stalled)."""

    CLAIM = "claim"
    """Claim them in their place in line, like any other message (the design's claim)."""
    LEAVE = "leave"
    """Leave them, and everything behind them in line, and count them in
    ``Claimed.orphans``: a relay's batch claim, so the one that kills its relay
    is found on its own."""
    ONLY = "only"
    """Claim only orphans, without counting the attempt an orphan lost while it
    shared its lease (another message may have been the one that crashed)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """One claim: lease up to ``limit`` due messages, earliest due first, for ``lease``.

    Each claimed message gets a fresh lease token and one more attempt;
    concurrent claims never return the same message.
    """

    limit: int
    lease: dt.timedelta
    now: dt.datetime | None = None
    """The store's time (None); tests that drive an injected clock pass theirs."""
    topics: Collection[str] | None = None
    """Topics claimed freely (None: all)."""
    caps: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Topics claimed at most that many each (their maxInFlight headroom)."""
    orphans: Orphans = Orphans.CLAIM
    max_bytes: int | None = None
    """Stop once the payloads taken reach it (the first message is always taken)."""
    run: int = 0
    """Of the messages that share a key only the first not yet delivered (the
    key's head) is claimed; with ``run``, also up to that many of the key's
    next messages, in order after all heads, while each is due (the caller
    starts each only once the one before it was acked)."""
    room: int | None = None
    """Messages in all, heads and runs (None: ``limit``)."""
    after: dt.datetime | None = None
    """Claim only messages due from ``after`` on: a low-watermark the caller's
    earlier claims passed, so that a claim does not walk again what they left
    behind while a held snapshot keeps it from being vacuumed (None: from the
    first). Orphans are claimed by when their lease ended, from ``after`` on:
    every message acked under the snapshot left an ended lease behind too."""

    def __post_init__(self) -> None:
        check_claim(self.lease, self.limit)


@dataclasses.dataclass(slots=True)
class Claimed:
    """What one claim leased, and how many orphans an ``Orphans.LEAVE`` claim passed."""

    messages: list[Message] = dataclasses.field(default_factory=list)
    orphans: int = 0
    last_due: dt.datetime | None = None
    """The due time of the last message the claim found ready, orphans aside
    (None: it found none): where the next claim's ``after`` may start."""


@dataclasses.dataclass(slots=True)
class Acked:
    """Delivered: remove it. Unkeyed, whoever holds it; keyed, only under its lease
    (a stale relay must not end the current holder's delivery early), and the
    key's next message, if a claim parked it, is unparked with it."""

    message: Message
    run: bool = False
    """A run's ack: the relay holds the key's next message (nothing to unpark)
    and starts it only once this is written, so a settlement of nothing else
    may be answered before it is flushed to disk (a crash of the database
    itself may undo it; the key's messages are then delivered again, in order)."""


@dataclasses.dataclass(slots=True)
class Retried:
    """Failed: due again after ``delay``, keeping ``reason``; fenced by its lease."""

    message: Message
    delay: dt.timedelta
    reason: str
    counted: bool = True
    """False: the receiver failed, not the message; the attempt is handed back."""


@dataclasses.dataclass(slots=True)
class Buried:
    """Kept for an operator with ``reason``; fenced by its lease."""

    message: Message
    reason: str


@dataclasses.dataclass(slots=True)
class Released:
    """Handed back unfinished, due at once, the attempt not counted; fenced by its lease."""

    message: Message


Outcome = Acked | Retried | Buried | Released


@dataclasses.dataclass(slots=True)
class Settled:
    """The ids a settlement wrote, per outcome. A fenced outcome missing here
    found its lease gone (another claim holds the message, or it is gone): it
    changed nothing. An ack missing here removed nothing."""

    acked: set[uuid.UUID] = dataclasses.field(default_factory=set)
    retried: set[uuid.UUID] = dataclasses.field(default_factory=set)
    buried: set[uuid.UUID] = dataclasses.field(default_factory=set)
    released: set[uuid.UUID] = dataclasses.field(default_factory=set)

    def of(self, outcome: Outcome) -> set[uuid.UUID]:
        """The ids written of ``outcome``'s kind."""
        if type(outcome) is Acked:
            return self.acked
        if type(outcome) is Retried:
            return self.retried
        return self.buried if type(outcome) is Buried else self.released


@dataclasses.dataclass(slots=True)
class Sorted:
    """A settlement's outcomes by kind, in the order given (for a backend's mapping)."""

    acks: list[Acked] = dataclasses.field(default_factory=list)
    retries: list[Retried] = dataclasses.field(default_factory=list)
    burials: list[Buried] = dataclasses.field(default_factory=list)
    releases: list[Released] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Sorted:
        acks = [o for o in outcomes if type(o) is Acked]
        if len(acks) == len(outcomes):  # as a rule: a round of deliveries
            return cls(acks)
        by = cls(acks)
        for o in outcomes:
            if type(o) is Retried:
                by.retries.append(o)
            elif type(o) is Buried:
                by.burials.append(o)
            elif type(o) is Released:
                by.releases.append(o)
        return by

    def kinds(self) -> int:
        """How many kinds of outcome there are."""
        return bool(self.acks) + bool(self.retries) + bool(self.burials) + bool(self.releases)


def check_claim(lease: dt.timedelta, limit: int) -> None:
    """Reject claim arguments that can only be mistakes."""
    if lease <= dt.timedelta(0):
        raise ValueError(f"outbox: lease must be positive, got {lease}")
    if limit < 1:
        raise ValueError(f"outbox: limit must be at least 1, got {limit}")


MAX_ERROR_TEXT = 200
"""The longest error text a selection of buried messages searches for."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BuriedFilter:
    """Which buried messages an operator's count, requeue or purge acts on: each
    field given narrows the selection; none given is every buried message.

    ``buried_by`` limits an action to what was buried by then: a dry run's
    ``BuriedCount.as_of``, so the confirmed action can only act on fewer than
    the count an operator confirmed (never on what was buried since).
    """

    topic: str | None = None
    ids: tuple[uuid.UUID, ...] | None = None
    older_than: dt.timedelta | None = None
    """Buried longer than this ago (by the store's time)."""
    error_contains: str | None = None
    """Its last error contains this text, in any case."""
    buried_by: dt.datetime | None = None

    @property
    def everything(self) -> bool:
        """Whether the filter narrows nothing."""
        return self == BuriedFilter()

    def matches(
        self,
        message: Message,
        buried_at: dt.datetime | None,
        last_error: str | None,
        now: dt.datetime,
    ) -> bool:
        """Whether a message buried at ``buried_at`` with ``last_error`` is selected
        at ``now`` (MemoryStore's reading; PostgreSQL's is buried_filter's)."""
        if buried_at is None:
            return False
        if self.topic is not None and message.topic != self.topic:
            return False
        if self.ids is not None and message.id not in self.ids:
            return False
        if self.older_than is not None and not buried_at < now - self.older_than:
            return False
        if self.buried_by is not None and buried_at > self.buried_by:
            return False
        wanted = self.error_contains
        return wanted is None or wanted.lower() in (last_error or "").lower()


@dataclasses.dataclass(frozen=True, slots=True)
class BuriedCount:
    """How many buried messages a filter selects, and when the newest of them
    was buried (None: none): the ``buried_by`` of the action it confirms."""

    count: int
    as_of: dt.datetime | None


def buried_selection(
    selection: BuriedFilter | None,
    *,
    ids: Sequence[uuid.UUID] | None = None,
    topic: str | None = None,
    older_than: dt.timedelta | None = None,
    purge: bool = False,
) -> BuriedFilter:
    """The filter of an operator call given either a ``selection`` or the
    earlier keyword arguments (``ids``, ``topic``, ``older_than``), not both.
    A ``purge`` needs one or the other: a purge of everything is asked for
    with ``BuriedFilter()``, never by leaving both out."""
    if selection is None:
        if purge and older_than is None:
            raise ValueError("purge_buried needs older_than or a selection")
        return BuriedFilter(
            ids=None if ids is None else tuple(ids), topic=topic, older_than=older_than
        )
    if ids is not None or topic is not None or older_than is not None:
        raise ValueError("give a selection or ids/topic/older_than, not both")
    return selection


MESSAGE_STATES = ("pending", "due_later", "in_flight", "parked", "buried")
"""The states a listing of messages selects by (StoredMessage.state)."""
MAX_LISTING = 500
"""The largest page a listing of messages returns."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageQuery:
    """A page of an operator's listing of messages (Store.list_messages): of
    ``state`` (one of MESSAGE_STATES), ``topic`` and ``key`` (None: any), in
    the order of their ids after ``after`` (the last id of the page before),
    at most ``limit``; the buried (state ``buried``) newest burial first,
    after ``after``'s burial; the due (states ``pending`` and ``due_later``)
    in the order relays claim them, by due time then id, after
    (``after_due``, ``after``). ``now``: a test's clock (states are the store's time).
    ValueError for a state or limit out of range."""

    state: str | None = None
    topic: str | None = None
    key: str | None = None
    after: uuid.UUID | None = None
    limit: int = 100
    now: dt.datetime | None = None
    error_contains: str | None = None
    """Its last error contains this text, in any case (as BuriedFilter's)."""
    older_than: dt.timedelta | None = None
    """Created longer than this ago (by the store's time); with state
    ``buried``, buried longer than this ago, as BuriedFilter's."""
    after_due: dt.datetime | None = None
    """With state ``pending`` or ``due_later``: the due time of ``after``."""

    def __post_init__(self) -> None:
        if self.error_contains is not None and not 0 < len(self.error_contains) <= MAX_ERROR_TEXT:
            raise ValueError(f"error text must be 1 to {MAX_ERROR_TEXT} characters")
        if self.state is not None and self.state not in MESSAGE_STATES:
            raise ValueError(f"state must be one of {', '.join(MESSAGE_STATES)}")
        if not 1 <= self.limit <= MAX_LISTING:
            raise ValueError(f"limit must be from 1 to {MAX_LISTING}")
