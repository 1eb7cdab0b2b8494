"""An in-memory Store for tests of code that uses the outbox.

It keeps the whole contract (tests/contract runs the same suite against it and
PostgreSQL): messages added inside ``begin()`` become visible only when the
block commits, claims lease under fresh tokens, stale write-backs change
nothing, buried messages stay. Its time is its own ``clock`` (the wall clock
by default), as PostgreSQL's is ``now()``. All state lives in one process and
one event loop; every method runs without yielding between its reads and
writes, which is what makes concurrent claims exclusive here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any

from outbox.durations import format_duration
from outbox.errors import NotFound
from outbox.memory_keys import KeyOrder, Row
from outbox.message import Message, check_message, validate_topic
from outbox.requests import (
    BuriedCount,
    BuriedFilter,
    Claimed,
    ClaimRequest,
    MessageQuery,
    Orphans,
    Outcome,
    Settled,
    Sorted,
    buried_selection,
)
from outbox.store import (
    SWEEP_BATCH,
    SWEEP_BUDGET,
    BlockedKey,
    RelayInfo,
    StorageHealth,
    StoredMessage,
    TopicSettings,
    TopicStats,
    message_ids,
)

__all__ = ["MemoryStore", "MemoryTx"]


def _gives_way(held: TopicSettings, claimant: TopicSettings) -> bool:
    """Whether the entry ``held`` yields to the resource ``claimant`` (as topic_govern)."""
    if held.source == claimant.source or held.source is None:
        return True
    if not held.source.startswith("kubernetes:"):
        return False  # an operator's `outbox topics` entry: a Conflict to resolve
    never = dt.datetime.max.replace(tzinfo=dt.UTC)
    mine = (claimant.owner_since or never, claimant.source or "")
    theirs = (held.owner_since or never, held.source or "")
    return mine < theirs


class MemoryTx:
    """A transaction of a MemoryStore: messages wait here until it commits."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.pending: list[Message] = []
        self.open = True


class MemoryStore:
    """A Store that keeps messages in a dict; ``clock`` is its time."""

    def __init__(self, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._rows: dict[uuid.UUID, Row] = {}
        self._topics: dict[str, TopicSettings] = {}
        self._keys = KeyOrder(self._rows, self._topics)
        """Which message of a key may go (reads the same rows and registry)."""
        self._relays: dict[uuid.UUID, RelayInfo] = {}
        self._unserved: dict[str, dt.datetime] = {}
        self._seq = 0

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryTx]:
        tx = MemoryTx(self)
        try:
            yield tx
        except BaseException:
            tx.open = False
            raise
        tx.open = False
        ids = [m.id for m in tx.pending]
        if len(set(ids)) != len(ids) or any(i in self._rows for i in ids):
            raise ValueError("outbox: a message with this id is already stored")
        for m in tx.pending:
            self._seq += 1
            self._rows[m.id] = Row(m, due_at=m.deliver_at or m.created_at, seq=self._seq)

    async def add(self, tx: MemoryTx, /, *msgs: Message) -> None:
        if tx.store is not self:
            raise ValueError("outbox: transaction belongs to another MemoryStore")
        if not tx.open:
            raise ValueError("outbox: transaction is already finished")
        for m in msgs:
            check_message(m)
        tx.pending.extend(msgs)

    async def claim(
        self, now: dt.datetime | None, lease: dt.timedelta, limit: int
    ) -> list[Message]:
        return (await self.claim_many(ClaimRequest(limit=limit, lease=lease, now=now))).messages

    async def claim_many(self, request: ClaimRequest) -> Claimed:
        now = request.now or self.clock()
        topics, solo, after = request.topics, request.orphans is Orphans.ONLY, request.after
        free = None if topics is None else set(topics)
        left = {t: n for t, n in request.caps.items() if n > 0}
        due = sorted(
            (
                r
                for r in self._rows.values()
                if r.buried_at is None
                and r.due_at <= now
                and (r.leased_until is None or r.leased_until <= now)
                and (free is None or r.message.topic in free or r.message.topic in left)
                and (not solo or r.leased_until is not None)
                and (after is None or (r.leased_until or r.due_at) >= after)
                and self._keys.heads(r, now)
            ),
            key=lambda r: (r.due_at, r.message.id),
        )
        candidates = []
        for row in due:
            topic = row.message.topic
            if free is not None and topic not in free:
                if left.get(topic, 0) < 1:
                    continue
                left[topic] -= 1
            candidates.append(row)
            if len(candidates) == request.limit:
                break
        picked, size = [], 0
        for row in candidates:
            if request.max_bytes is not None and size >= request.max_bytes:
                break
            picked.append(row)
            size += len(row.message.payload)
        ready = [r.due_at for r in picked if r.leased_until is None]  # orphans aside
        token = uuid.uuid4()
        until = now + request.lease
        claimed = Claimed(last_due=max(ready) if ready else None)
        behind_orphan = False
        for row in picked:
            orphan = row.leased_until is not None
            if request.orphans is Orphans.LEAVE and (orphan or behind_orphan):
                claimed.orphans += 1  # nothing behind an orphan goes before it
                behind_orphan = True
                continue
            forgiven = solo and orphan and not row.solo
            attempts = row.message.attempts + (0 if forgiven else 1)
            row.message = dataclasses.replace(row.message, attempts=attempts, lease=token)
            row.leased_until = until  # due_at stays: the message keeps its place in line
            row.token, row.solo = token, solo
            claimed.messages.append(row.message)
        if request.run > 0 and not solo:
            room = request.limit if request.room is None else request.room
            self._keys.run(
                claimed.messages, request.run, room, request.max_bytes, now, until, token
            )
        return claimed

    async def settle(
        self, outcomes: Sequence[Outcome], *, now: dt.datetime | None = None
    ) -> Settled:
        by = Sorted.of(outcomes)
        settled = Settled()
        for a in by.acks:  # unkeyed: whoever holds it; keyed: under its lease
            row = self._rows.get(a.message.id)
            if row is not None and (a.message.key is None or row.token == a.message.lease):
                del self._rows[a.message.id]
                settled.acked.add(a.message.id)
        settled.retried = await self.retry_many(
            [(r.message, r.delay, r.reason) for r in by.retries],
            now=now,
            uncounted={r.message.id for r in by.retries if not r.counted},
        )
        settled.buried = await self.bury_many([(b.message, b.reason) for b in by.burials], now=now)
        settled.released = await self.release([r.message for r in by.releases], now)
        return settled

    async def ack_many(
        self,
        message_ids: Sequence[uuid.UUID],
        *,
        tokens: Collection[uuid.UUID] | None = None,
        keyed: bool = True,
        durable: bool = True,
    ) -> set[uuid.UUID]:
        held = None if tokens is None else set(tokens)
        removed = set()
        for i in set(message_ids):
            row = self._rows.get(i)
            if row is None:
                continue
            if row.message.key is not None and held is not None and row.token not in held:
                continue  # another lease holds it now (see Store.ack_many)
            del self._rows[i]
            removed.add(i)
        return removed

    async def retry_many(
        self,
        items: Sequence[tuple[Message, dt.timedelta, str]],
        *,
        now: dt.datetime | None = None,
        uncounted: Collection[uuid.UUID] = (),
    ) -> set[uuid.UUID]:
        now = now or self.clock()
        done = set()
        for m, delay, reason in items:
            row = self._held(m)
            if row is not None:
                row.due_at, row.leased_until, row.last_error = now + delay, None, reason
                if m.id in uncounted:
                    attempts = max(row.message.attempts - 1, 0)
                    row.message = dataclasses.replace(row.message, attempts=attempts)
                done.add(m.id)
        return done

    async def bury_many(
        self, items: Sequence[tuple[Message, str]], *, now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        now = now or self.clock()
        done = set()
        for m, reason in items:
            row = self._held(m)
            if row is not None:
                row.buried_at, row.leased_until, row.last_error = now, None, reason
                done.add(m.id)
        return done

    async def release(
        self, messages: Sequence[Message], now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        now = now or self.clock()
        released = set()
        ids, tokens = message_ids(messages)
        for message_id, token in dict(zip(ids, tokens, strict=True)).items():
            row = self._rows.get(message_id)
            if row is None or row.buried_at is not None:
                continue
            if token is not None and row.token != token:
                continue
            attempts = max(row.message.attempts - 1, 0)
            row.message = dataclasses.replace(row.message, attempts=attempts)
            row.leased_until = None
            released.add(message_id)
        return released

    async def ack(self, message_id: uuid.UUID) -> None:
        # A key's next message needs no unparking here: heads are worked out
        # at each claim.
        self._row(message_id)  # NotFound if it is not there
        del self._rows[message_id]

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> bool:
        row = self._row(message_id)
        row.due_at, row.leased_until, row.last_error = at, None, reason
        return True

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> bool:
        row = self._row(message_id)
        row.buried_at = at or self.clock()
        row.leased_until, row.last_error = None, reason
        return True

    async def register_relay(
        self, relay: RelayInfo, ttl: dt.timedelta, *, now: dt.datetime | None = None
    ) -> dt.datetime:
        now = now or self.clock()
        started = self._relays[relay.id].started_at if relay.id in self._relays else now
        self._relays[relay.id] = dataclasses.replace(
            relay, started_at=started, seen_at=now, expires_at=now + ttl
        )
        return now

    async def unregister_relay(self, relay_id: uuid.UUID) -> None:
        self._relays.pop(relay_id, None)

    async def relays(self, *, now: dt.datetime | None = None) -> list[RelayInfo]:
        now = now or self.clock()
        live = [r for r in self._relays.values() if r.expires_at and r.expires_at > now]
        return sorted(live, key=lambda r: (r.started_at or now, r.id))

    async def wakeups(self, wake: Callable[[frozenset[str] | None], None]) -> None:
        # No signal in one process: the relay's poll is the floor, as designed.
        await asyncio.get_running_loop().create_future()

    async def rotate(self, *, now: dt.datetime | None = None) -> int:
        # A removed message is gone at once: nothing to empty, nothing to move.
        return 0

    async def bury_unserved(
        self,
        grace: dt.timedelta,
        *,
        now: dt.datetime | None = None,
        batch: int = SWEEP_BATCH,
        budget: int = SWEEP_BUDGET,
    ) -> dict[str, int]:
        now = now or self.clock()
        served = {t for r in await self.relays(now=now) for t in r.topics}
        waiting = {r.message.topic for r in self._rows.values() if self._due(r, now)}
        unserved = waiting - served - set(self._topics)
        expired = {t for t in unserved if t in self._unserved and self._unserved[t] <= now - grace}
        self._unserved = {t: self._unserved.get(t, now) for t in unserved}
        why = f" (no live relay served it for {format_duration(grace)})"
        buried: dict[str, int] = {}
        for r in self._rows.values():
            if budget <= 0:
                break
            if r.message.topic in expired and self._due(r, now):
                r.buried_at, r.leased_until = now, None
                r.last_error = f"no handler for topic {r.message.topic}{why}"
                buried[r.message.topic] = buried.get(r.message.topic, 0) + 1
                budget -= 1
        return dict(sorted(buried.items()))

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        return self._row(message_id).state()

    async def list_messages(self, query: MessageQuery) -> list[StoredMessage]:
        now = query.now or self.clock()
        listed = []
        for r in self._listing_order(query):
            m = r.message
            if query.topic not in (None, m.topic) or query.key not in (None, m.key):
                continue
            since = r.buried_at if query.state == "buried" else m.created_at
            if query.older_than is not None and (since is None or since >= now - query.older_than):
                continue
            wanted = query.error_contains
            if wanted is not None and wanted.lower() not in (r.last_error or "").lower():
                continue
            waiting = r.buried_at is None and r.leased_until is None
            parked = waiting and m.key is not None and not self._keys.heads(r, now)
            stored = dataclasses.replace(
                r.state(),
                message=dataclasses.replace(m, payload=b""),
                size=len(m.payload),
                parked=parked,
            )
            if query.state in (None, stored.state(now)):
                listed.append(stored)
                if len(listed) == query.limit:
                    break
        return listed

    def _listing_order(self, query: MessageQuery) -> list[Row]:
        """The rows a listing reads, in its order, after its ``after``."""
        rows = sorted(self._rows.values(), key=lambda r: r.message.id)
        if query.state == "buried":  # newest burial first, from the burial of ``after``
            ordered = sorted(
                (r for r in rows if r.buried_at is not None),
                key=lambda r: (r.buried_at, r.message.id),
                reverse=True,
            )
            if query.after is None:
                return ordered
            after = self._rows.get(query.after)
            if after is None or after.buried_at is None:
                return []
            mark = (after.buried_at, after.message.id)
            return [r for r in ordered if (r.buried_at, r.message.id) < mark]
        if query.state in ("pending", "due_later"):  # as relays claim them
            ordered = sorted(rows, key=lambda r: (r.due_at, r.message.id))
            if query.after is None:
                return ordered
            if query.after_due is None:
                return []
            due = (query.after_due, query.after)
            return [r for r in ordered if (r.due_at, r.message.id) > due]
        return [r for r in rows if query.after is None or r.message.id > query.after]

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        within: dt.timedelta | None = None,
        limit: int = 100,
        now: dt.datetime | None = None,
    ) -> list[StoredMessage]:
        now = now or self.clock()
        since = None if within is None else now - within
        rows = [
            r
            for r in self._selected(BuriedFilter(topic=topic), now)
            if since is None or (r.buried_at is not None and r.buried_at >= since)
        ]
        rows.sort(key=lambda r: (r.buried_at, r.message.id), reverse=True)
        listed = []
        for r in rows[:limit]:
            state = r.state()
            bare = dataclasses.replace(state.message, payload=b"")
            listed.append(dataclasses.replace(state, message=bare, size=len(state.message.payload)))
        return listed

    async def count_buried(
        self, selection: BuriedFilter, *, now: dt.datetime | None = None
    ) -> BuriedCount:
        rows = self._selected(selection, now or self.clock())
        return BuriedCount(len(rows), max((r.buried_at for r in rows if r.buried_at), default=None))

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
        now = now or self.clock()
        rows = self._selected(buried_selection(selection, ids=ids, topic=topic), now)
        if not dry_run:
            for r in rows:
                r.message = dataclasses.replace(r.message, attempts=0)
                r.buried_at, r.leased_until, r.due_at = None, None, now
                r.token, r.solo = None, False
                r.requeues += 1
                r.requeued_at = now
        return len(rows)

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
        chosen = buried_selection(selection, topic=topic, older_than=older_than, purge=True)
        old = self._selected(chosen, now or self.clock())
        if not dry_run:
            for r in old:
                del self._rows[r.message.id]
        return len(old)

    async def storage(self) -> StorageHealth:
        # Nothing dead, nothing held: a removed message is gone at once.
        return StorageHealth(0.0, 0, 0, 0)

    async def topic_stats(
        self, *, max_age: dt.timedelta | None = None, blocked: bool = True
    ) -> list[TopicStats]:
        now = self.clock()
        keys: dict[str, list[Any]] = {}
        for b in await self.keys_blocked(limit=len(self._rows)) if blocked else ():
            entry = keys.setdefault(b.topic, [0, None])
            entry[0] += 1
            entry[1] = b.since if entry[1] is None else min(entry[1], b.since)
        stats: dict[str, list[Any]] = {}
        for r in self._rows.values():
            entry = stats.setdefault(r.message.topic, [0, 0, None, 0, 0])
            if r.buried_at is not None:
                entry[1] += 1
                continue
            entry[0] += 1
            entry[3] += r.leased_until is not None
            entry[4] += r.leased_until is None and r.due_at > now
            if entry[2] is None or r.message.created_at < entry[2]:
                entry[2] = r.message.created_at
        out = []
        for topic in sorted(stats):
            pending, buried, oldest, flying, later = stats[topic]
            n, since = keys.get(topic, (0, None)) if blocked else (None, None)
            out.append(
                TopicStats(
                    topic, pending, buried, oldest, n, since, flying if blocked else None, later
                )
            )
        return out

    async def may_change(self) -> bool:
        return True

    async def backlog_measurement(self) -> tuple[dt.datetime, list[TopicStats]] | None:
        # Nothing is shared between processes: every measurement is this one.
        return self.clock(), await self.topic_stats()

    async def keys_blocked(self, *, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        return self._keys.blocked(topic=topic, limit=limit)

    async def topics(self) -> dict[str, TopicSettings]:
        return dict(self._topics)

    async def set_topic(self, settings: TopicSettings, now: dt.datetime | None = None) -> None:
        validate_topic(settings.topic)
        self._topics[settings.topic] = dataclasses.replace(
            settings, config=dict(settings.config), updated_at=now or self.clock()
        )

    async def govern_topic(
        self, settings: TopicSettings, now: dt.datetime | None = None
    ) -> str | None:
        validate_topic(settings.topic)
        held = self._topics.get(settings.topic)
        if held is None or _gives_way(held, settings):
            await self.set_topic(settings, now)
            return settings.source
        return held.source

    async def delete_topic(self, topic: str) -> bool:
        return self._topics.pop(topic, None) is not None

    def _selected(self, selection: BuriedFilter, now: dt.datetime) -> list[Row]:
        return [
            r
            for r in self._rows.values()
            if selection.matches(r.message, r.buried_at, r.last_error, now)
        ]

    @staticmethod
    def _due(r: Row, now: dt.datetime) -> bool:
        leased = r.leased_until is not None and r.leased_until > now
        return r.buried_at is None and r.due_at <= now and not leased

    def _held(self, m: Message) -> Row | None:
        """``m``'s row while the lease ``m`` carries still holds it."""
        row = self._rows.get(m.id)
        if row is None or row.buried_at is not None or row.token != m.lease:
            return None
        return row

    def _row(self, message_id: uuid.UUID) -> Row:
        try:
            return self._rows[message_id]
        except KeyError:
            raise NotFound(message_id) from None
