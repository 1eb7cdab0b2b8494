"""The PostgreSQL store: one table, partitioned as a ring, FOR UPDATE SKIP LOCKED.

Producers add messages through their own transaction (``begin()`` or a
connection they already hold), so a message commits or rolls back with the
change it belongs to. Relays claim, ack, retry and bury through the pool,
each claim reading only the partitions of the ring that may hold due
messages, each write-back the partition its message was claimed from
(outbox.postgres.ring).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import psycopg_pool

from outbox.durations import format_duration
from outbox.errors import OutboxError, StoreUnavailable, first_line
from outbox.message import Message
from outbox.postgres.claims import BY_TOPIC, claim_params, claim_statement
from outbox.postgres.connection import keepalives
from outbox.postgres.operator import OperatorQueries
from outbox.postgres.pool import connect_pool
from outbox.postgres.producer import add, transaction
from outbox.postgres.queries import QUERIES
from outbox.postgres.ring import Ring, Rotation, SlotPicker
from outbox.postgres.statements import DEADLINE, Statements
from outbox.postgres.writes import WriteBacks
from outbox.requests import (
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
)

__all__ = [
    "BY_TOPIC",
    "DEADLINE",
    "PostgresStore",
    "claim_params",
    "connect_pool",
    "keepalives",
]

_CLAIM_RUN = QUERIES["message_claim_run"]
_KEY_REPAIR = QUERIES["key_repair"]
KEY_REPAIR_SCAN = 10_000
"""Most parked messages one sweep looks at for keys whose head is gone."""
_RING_STATE = QUERIES["ring_state"]
_RELAY_REGISTER = QUERIES["relay_register"]
_RELAY_UNREGISTER = QUERIES["relay_unregister"]
_RELAY_LIST = QUERIES["relay_list"]
_RELAY_FORGET_DEAD = QUERIES["relay_forget_dead"]
_TRY_LOCK = QUERIES["try_lock"]
_UNSERVED_BURY = QUERIES["unserved_bury"]
_UNSERVED_NOTE = QUERIES["unserved_note"]

# One relay at a time notes unserved topics (the burial batches that follow
# are safe side by side: SKIP LOCKED).
_SWEEP_LOCK_KEY = 0x6F7574626F7873  # "outboxs"

log = logging.getLogger("outbox.postgres")


class PostgresStore:
    """A Store over a psycopg AsyncConnectionPool.

    Every call but ``begin()`` (the application's own transaction) has a
    deadline: a statement the database does not answer within ``deadline``
    seconds (a partition, a stalled server) fails as StoreUnavailable, its
    connection is dropped, and the relay tries again with its backoff.
    The operator's and the registry's queries are an object of their own,
    ``operator`` (outbox.postgres.operator); the store offers them too.
    """

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool,
        *,
        listen_url: str | None = None,
        deadline: float = DEADLINE,
    ) -> None:
        self.pool = pool
        self.listen_url = listen_url
        """Where wakeups() LISTENs; None: the pool's own conninfo."""
        self.deadline = deadline
        self.statements = Statements(pool, deadline)
        self.operator = OperatorQueries(self.statements)
        """Inspecting, requeueing and purging, the backlog count, the topic registry."""
        self.slots = SlotPicker()
        """Which partitions of the outbox's ring a claim reads."""
        self.rotation = Rotation(self.statements, self.slots)
        """Empties the ring's slots (outbox.postgres.ring)."""
        self.writes = WriteBacks(self.statements, self.slots)
        """Acks, retries, burials and releases (outbox.postgres.writes)."""

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection inside a transaction: commit on exit, roll back on error.

        Once committed, relays are woken for the messages added in it.
        """
        async with (
            self.statements.translated(bounded=False, statements=False),
            self.pool.connection() as conn,
            transaction(conn),
        ):
            yield conn

    async def add(self, tx: psycopg.AsyncConnection[Any], /, *msgs: Message) -> None:
        """Insert ``msgs`` through ``tx``, which must be inside the caller's transaction."""
        await add(tx, *msgs)

    async def claim(
        self, now: dt.datetime | None, lease: dt.timedelta, limit: int
    ) -> list[Message]:
        return (await self.claim_many(ClaimRequest(limit=limit, lease=lease, now=now))).messages

    async def claim_many(self, request: ClaimRequest) -> Claimed:
        token = uuid.uuid4()
        slots, until = await self._where(request)
        if until is not None and request.after is not None and until < request.after:
            request = dataclasses.replace(request, after=until)
        params = claim_params(request, token, slots)
        rows = await self.statements.fetch(claim_statement(params), params)
        claimed = Claimed([_claimed(r, token) for r in rows if r[0] is not None])
        if request.now is None:
            self.slots.found({m.slot for m in claimed.messages})
        claimed.orphans = len(rows) - len(claimed.messages)
        ready = [r[10] for r in rows if not r[9]]  # the picked rows' due times, orphans aside
        claimed.last_due = max(ready) if ready else None
        room = (request.limit if request.room is None else request.room) - len(claimed.messages)
        if request.run <= 0 or room <= 0 or request.orphans is Orphans.ONLY:
            return claimed
        heads = [r for r in rows if r[0] is not None and r[5] is not None]
        if heads:
            used = sum(len(m.payload) for m in claimed.messages)
            max_bytes = request.max_bytes
            more = {
                "now": request.now,
                "lease": request.lease,
                "token": token,
                "topics": [r[1] for r in heads],
                "keys": [r[5] for r in heads],
                "seqs": [r[6] for r in heads],
                "run": request.run,
                "limit": room,
                "max_bytes": None if max_bytes is None else max(max_bytes - used, 0),
            }
            try:
                run = await self.statements.fetch(_CLAIM_RUN, more)
            except OutboxError as exc:
                # What the claim took is leased: it is returned all the same,
                # or it would wait out its lease in no relay's hands. The
                # keys' runs go to the next claim.
                log.info("claimed the heads of keys without their runs: %s", exc)
            else:
                claimed.messages.extend(_claimed(r, token) for r in run)
        return claimed

    async def _where(self, request: ClaimRequest) -> tuple[list[int], dt.datetime | None]:
        """The ring's slots ``request`` reads, and the watermark the long-stay
        partition needs when it is read (see SlotPicker.pick)."""
        if request.now is not None:  # a test's clock says nothing of the ring's
            return (self.slots.ring or Ring()).every, None
        if self.slots.stale():
            try:
                [row] = await self.statements.fetch(_RING_STATE, {})
            except StoreUnavailable:
                raise
            except OutboxError as exc:  # a relay granted before the ring (no SELECT on it)
                self.slots.unread(first_line(exc))
            else:
                self.slots.update(row)
        return self.slots.pick()

    async def rotate(self, *, now: dt.datetime | None = None) -> int:
        return await self.rotation.once(now)

    async def settle(
        self, outcomes: Sequence[Outcome], *, now: dt.datetime | None = None
    ) -> Settled:
        return await self.writes.settle(outcomes, now=now)

    async def ack_many(
        self,
        message_ids: Sequence[uuid.UUID],
        *,
        tokens: Collection[uuid.UUID] | None = None,
        keyed: bool = True,
        durable: bool = True,
    ) -> set[uuid.UUID]:
        return await self.writes.ack_many(message_ids, tokens=tokens, keyed=keyed, durable=durable)

    async def retry_many(
        self,
        items: Sequence[tuple[Message, dt.timedelta, str]],
        *,
        now: dt.datetime | None = None,
        uncounted: Collection[uuid.UUID] = (),
    ) -> set[uuid.UUID]:
        if not items:
            return set()
        retries = [Retried(m, delay, reason, m.id not in uncounted) for m, delay, reason in items]
        return (await self.settle(retries, now=now)).retried

    async def bury_many(
        self, items: Sequence[tuple[Message, str]], *, now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        if not items:
            return set()
        return (await self.settle([Buried(m, reason) for m, reason in items], now=now)).buried

    async def release(
        self, messages: Sequence[Message], now: dt.datetime | None = None
    ) -> set[uuid.UUID]:
        if not messages:
            return set()
        return (await self.settle([Released(m) for m in messages], now=now)).released

    async def ack(self, message_id: uuid.UUID) -> None:
        await self.writes.ack(message_id)

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> bool:
        return await self.writes.retry(message_id, at, reason)

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> bool:
        return await self.writes.bury(message_id, reason, at=at)

    # -- the operator's and the registry's queries (self.operator) ---------------

    async def keys_blocked(self, *, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        return await self.operator.keys_blocked(topic=topic, limit=limit)

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        return await self.operator.get(message_id)

    async def list_messages(self, query: MessageQuery) -> list[StoredMessage]:
        return await self.operator.list_messages(query)

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        within: dt.timedelta | None = None,
        limit: int = 100,
        now: dt.datetime | None = None,
    ) -> list[StoredMessage]:
        return await self.operator.list_buried(topic=topic, within=within, limit=limit, now=now)

    async def count_buried(
        self, selection: BuriedFilter, *, now: dt.datetime | None = None
    ) -> BuriedCount:
        return await self.operator.count_buried(selection, now=now)

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
        return await self.operator.requeue(
            ids=ids, topic=topic, dry_run=dry_run, now=now, batch=batch, selection=selection
        )

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
        return await self.operator.purge_buried(
            older_than, topic=topic, dry_run=dry_run, now=now, batch=batch, selection=selection
        )

    async def topic_stats(
        self, *, max_age: dt.timedelta | None = None, blocked: bool = True
    ) -> list[TopicStats]:
        return await self.operator.topic_stats(max_age=max_age, blocked=blocked)

    async def backlog_measurement(self) -> tuple[dt.datetime, list[TopicStats]] | None:
        return await self.operator.backlog_measurement()

    async def topics(self) -> dict[str, TopicSettings]:
        return await self.operator.topics()

    async def may_change(self) -> bool:
        return await self.operator.may_change()

    async def storage(self) -> StorageHealth:
        return await self.operator.storage()

    async def set_topic(self, settings: TopicSettings, now: dt.datetime | None = None) -> None:
        await self.operator.set_topic(settings, now)

    async def govern_topic(
        self, settings: TopicSettings, now: dt.datetime | None = None
    ) -> str | None:
        return await self.operator.govern_topic(settings, now)

    async def delete_topic(self, topic: str) -> bool:
        return await self.operator.delete_topic(topic)

    # -- the fleet -----------------------------------------------------------------

    async def register_relay(
        self, relay: RelayInfo, ttl: dt.timedelta, *, now: dt.datetime | None = None
    ) -> dt.datetime:
        params = {
            "id": relay.id,
            "host": relay.host,
            "pid": relay.pid,
            "version": relay.version,
            "topics": list(relay.topics),
            "kinds": list(relay.kinds),
            "handlers": list(relay.handlers),
            "ttl": ttl,
            "now": now,
        }
        [(seen,)] = await self.statements.fetch(_RELAY_REGISTER, params)
        at: dt.datetime = seen
        return at

    async def unregister_relay(self, relay_id: uuid.UUID) -> None:
        await self.statements.count(_RELAY_UNREGISTER, {"id": relay_id})

    async def relays(self, *, now: dt.datetime | None = None) -> list[RelayInfo]:
        return [_relay(r) for r in await self.statements.fetch(_RELAY_LIST, {"now": now})]

    async def wakeups(self, wake: Callable[[frozenset[str] | None], None]) -> None:
        # LISTEN needs a session of its own, outside the pool.
        from outbox.postgres.listen import listen

        url = self.listen_url or self.pool.conninfo
        if isinstance(url, str):
            await listen(url, wake)
        else:  # a pool whose conninfo is computed: no wake-ups, polling only
            await anyio.sleep_forever()

    async def bury_unserved(
        self,
        grace: dt.timedelta,
        *,
        now: dt.datetime | None = None,
        batch: int = SWEEP_BATCH,
        budget: int = SWEEP_BUDGET,
    ) -> dict[str, int]:
        why = f" (no live relay served it for {format_duration(grace)})"
        async with self.statements.translated(bounded=False), self.pool.connection() as conn:
            async with self.statements.bounded(), conn.transaction():
                cur = await conn.execute(_TRY_LOCK, {"key": _SWEEP_LOCK_KEY})
                row = await cur.fetchone()
                if not row or not row[0]:
                    return {}
                await conn.execute(_RELAY_FORGET_DEAD, {"now": now})
                await conn.execute(_KEY_REPAIR, {"limit": KEY_REPAIR_SCAN})
                cur = await conn.execute(_UNSERVED_NOTE, {"now": now, "grace": grace})
                row = await cur.fetchone()
            if not row or not row[0]:
                return {}
            # Each batch commits on its own: a relay killed mid-sweep keeps what
            # it buried, and no statement holds more than ``batch`` row locks.
            buried: dict[str, int] = {}
            params = {"now": now, "grace": grace, "why": why}
            left = budget
            while left > 0:
                async with self.statements.bounded(), conn.transaction():
                    cur = await conn.execute(_UNSERVED_BURY, {**params, "limit": min(batch, left)})
                    counts = await cur.fetchall()
                n = sum(c for _, c in counts)
                for topic, c in counts:
                    buried[topic] = buried.get(topic, 0) + c
                left -= n
                if n < batch:
                    break
        return dict(sorted(buried.items()))


def _relay(r: Any) -> RelayInfo:
    """The RelayInfo of a row of relay_list."""
    id_, host, pid, version, topics, kinds, started, seen, expires, handlers = r
    return RelayInfo(
        id_, host, pid, version, tuple(topics), tuple(kinds), started, seen, expires,
        tuple(handlers),
    )  # fmt: skip


def _claimed(r: Any, token: uuid.UUID) -> Message:
    """The Message of a row of message_claim or message_claim_run: id, topic,
    payload, created_at, attempts, key, seq, headers, slot (then the claim's
    orphan and due time)."""
    return Message(
        id=r[0],
        topic=r[1],
        payload=r[2].encode(),
        created_at=r[3].astimezone(dt.UTC),
        attempts=r[4],
        key=r[5],
        headers=r[7] or {},
        lease=token,
        slot=r[8],
    )
