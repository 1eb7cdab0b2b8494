"""The operator's and the registry's queries of the PostgreSQL store.

Inspecting, requeueing and purging buried messages, blocked keys, the backlog
count, and the topic registry: an object PostgresStore (outbox.postgres.store)
holds and offers, running its statements through the store's Statements.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg.errors
from psycopg.types.json import Jsonb

from outbox.errors import NotFound, QueryTooBroad
from outbox.message import Message, validate_topic
from outbox.postgres.queries import QUERIES
from outbox.postgres.statements import Statements
from outbox.requests import BuriedCount, BuriedFilter, MessageQuery, buried_selection
from outbox.store import (
    BLOCKED_SCAN,
    SWEEP_BATCH,
    BlockedKey,
    StorageHealth,
    StoredMessage,
    TopicSettings,
    TopicStats,
)

__all__ = ["OperatorQueries"]

_KEYS_BLOCKED = QUERIES["keys_blocked"]
_GET = QUERIES["message_get"]
_LIST = QUERIES["message_list"]
_LIST_BURIED = QUERIES["message_list_buried"]
_LIST_DUE = QUERIES["message_list_due"]
_LISTINGS = {"buried": _LIST_BURIED, "pending": _LIST_DUE, "due_later": _LIST_DUE}
"""The listings read in an order of their own, from an index of their rows."""
LIST_WAIT = 2.0
"""Longest a listing of messages may read (seconds): a filter that matches little
in a large outbox is refused with QueryTooBroad rather than read it all."""
_LIST_TIMEOUT = "SELECT set_config('statement_timeout', %(ms)s, true)"
_BURIED_LIST = QUERIES["buried_list"]
_BURIED_REQUEUE = QUERIES["buried_requeue"]
_BURIED_PURGE = QUERIES["buried_purge"]
_BURIED_COUNT = QUERIES["buried_count"]
_BACKLOG_READ = QUERIES["backlog_read"]
_BACKLOG_LAST = QUERIES["backlog_last"]
_BACKLOG_MEASURE = QUERIES["backlog_measure"]
_BACKLOG_MEASURE_BLOCKED = QUERIES["backlog_measure_blocked"]
_BACKLOG_IN_FLIGHT = QUERIES["backlog_in_flight"]
_TOPIC_LIST = QUERIES["topic_list"]
_MAY_CHANGE = QUERIES["may_change"]
_STORAGE_HEALTH = QUERIES["storage_health"]
_TOPIC_UPSERT = QUERIES["topic_upsert"]
_TOPIC_DELETE = QUERIES["topic_delete"]
_TOPIC_GOVERN = QUERIES["topic_govern"]
_TOPIC_HOLDER = QUERIES["topic_holder"]
_TRY_LOCK = QUERIES["try_lock"]
BACKLOG_LOCK_KEY = 0x6F7574626F7862  # "outboxb": one relay at a time counts the backlog


class OperatorQueries:
    """The operator's and the registry's queries, run through ``statements``
    (the PostgresStore's, which hands this object out as ``operator``)."""

    def __init__(self, statements: Statements, list_wait: float = LIST_WAIT) -> None:
        self.statements = statements
        self.list_wait = list_wait
        """How long a listing of messages may read (LIST_WAIT)."""

    async def keys_blocked(self, *, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        params = {"topic": topic, "limit": limit, "scan": BLOCKED_SCAN}
        return [BlockedKey(*r) for r in await self.statements.fetch(_KEYS_BLOCKED, params)]

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        rows = await self.statements.fetch(_GET, {"id": message_id})
        if not rows:
            raise NotFound(message_id)
        return _stored(rows[0])

    async def list_messages(self, query: MessageQuery) -> list[StoredMessage]:
        params = dataclasses.asdict(query)
        async with (
            self.statements.translated(),
            self.statements.pool.connection() as conn,
            conn.transaction(),
        ):
            await conn.execute(_LIST_TIMEOUT, {"ms": str(max(int(self.list_wait * 1000), 1))})
            try:
                listing = _LISTINGS.get(query.state or "", _LIST)
                cur = await conn.execute(listing, params)
                rows = await cur.fetchall()
            except psycopg.errors.QueryCanceled:
                raise QueryTooBroad(self.list_wait) from None
        return [_stored(r) for r in rows]

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        within: dt.timedelta | None = None,
        limit: int = 100,
        now: dt.datetime | None = None,
    ) -> list[StoredMessage]:
        params = {"topic": topic, "within": within, "limit": limit, "now": now}
        return [_stored(r) for r in await self.statements.fetch(_BURIED_LIST, params)]

    async def count_buried(
        self, selection: BuriedFilter, *, now: dt.datetime | None = None
    ) -> BuriedCount:
        [(n, newest)] = await self.statements.fetch(_BURIED_COUNT, _selecting(selection, now))
        return BuriedCount(int(n), newest)

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
        chosen = buried_selection(selection, ids=ids, topic=topic)
        if dry_run:
            return (await self.count_buried(chosen, now=now)).count
        params = {**_selecting(chosen, now), "limit": batch}
        return await self.statements.in_batches(_BURIED_REQUEUE, params)

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
        if dry_run:
            return (await self.count_buried(chosen, now=now)).count
        params = {**_selecting(chosen, now), "limit": batch}
        return await self.statements.in_batches(_BURIED_PURGE, params, unpark=True)

    async def topic_stats(
        self, *, max_age: dt.timedelta | None = None, blocked: bool = True
    ) -> list[TopicStats]:
        counted = await self._counted(max_age=max_age, blocked=blocked)
        if not blocked:  # the controller's grant reads no lease column
            return counted
        # In flight: a look into the leased index, always fresh (at most what
        # the relays hold), never kept in the shared count, whose entries
        # relays of earlier releases read by position.
        flying = dict(await self.statements.fetch(_BACKLOG_IN_FLIGHT, {}))
        return [dataclasses.replace(s, in_flight=flying.get(s.topic, 0)) for s in counted]

    async def backlog_measurement(self) -> tuple[dt.datetime, list[TopicStats]] | None:
        rows = await self.statements.fetch(_BACKLOG_LAST, {})
        if not rows:
            return None
        [(at, entries, later)] = rows
        flying = dict(await self.statements.fetch(_BACKLOG_IN_FLIGHT, {}))
        stats = _with_due_later([_backlog_entry(*entry) for entry in entries], later)
        return at, [dataclasses.replace(s, in_flight=flying.get(s.topic, 0)) for s in stats]

    async def _counted(self, *, max_age: dt.timedelta | None, blocked: bool) -> list[TopicStats]:
        measure = _BACKLOG_MEASURE_BLOCKED if blocked else _BACKLOG_MEASURE
        params = {"scan": BLOCKED_SCAN}
        if max_age is None:
            rows = await self.statements.fetch(measure, {**params, "keep": False})
            return [_measured(r, blocked) for r in rows]
        # Counting a large backlog may take longer than a claim: six deadlines.
        async with (
            self.statements.translated(bounded=False),
            self.statements.bounded(6 * self.statements.deadline),
            self.statements.pool.connection() as conn,
            conn.transaction(),
        ):
            cur = await conn.execute(_TRY_LOCK, {"key": BACKLOG_LOCK_KEY})
            row = await cur.fetchone()
            mine = bool(row and row[0])
            cur = await conn.execute(_BACKLOG_READ, {"max_age": max_age})
            last = await cur.fetchone()
            # Fresh, or being measured by another relay right now: read it.
            if last is not None and (last[1] or not mine):
                return _with_due_later([_backlog_entry(*entry) for entry in last[0]], last[2])
            # Kept only with the blocked keys: a count without them would
            # hide from the others what a relay's count found.
            cur = await conn.execute(measure, {**params, "keep": mine and blocked})
            return [_measured(r, blocked) for r in await cur.fetchall()]

    async def topics(self) -> dict[str, TopicSettings]:
        return {r[0]: TopicSettings(*r) for r in await self.statements.fetch(_TOPIC_LIST, {})}

    async def may_change(self) -> bool:
        [(allowed,)] = await self.statements.fetch(_MAY_CHANGE, {})
        return bool(allowed)

    async def storage(self) -> StorageHealth:
        [(seconds, transactions, dead, size)] = await self.statements.fetch(_STORAGE_HEALTH, {})
        return StorageHealth(max(seconds, 0.0), transactions, dead, size)

    async def set_topic(self, settings: TopicSettings, now: dt.datetime | None = None) -> None:
        await self.statements.count(_TOPIC_UPSERT, _topic_params(settings, now))

    async def govern_topic(
        self, settings: TopicSettings, now: dt.datetime | None = None
    ) -> str | None:
        params = {**_topic_params(settings, now), "owner_since": settings.owner_since}
        rows = await self.statements.fetch(_TOPIC_GOVERN, params)
        if not rows:  # lost to a writer that committed after this statement began
            rows = await self.statements.fetch(_TOPIC_HOLDER, {"topic": settings.topic})
        return rows[0][0] if rows else None

    async def delete_topic(self, topic: str) -> bool:
        return await self.statements.count(_TOPIC_DELETE, {"topic": topic}) > 0


def _selecting(selection: BuriedFilter, now: dt.datetime | None) -> dict[str, Any]:
    """The parameters of a selection of buried messages (buried_count's)."""
    return {
        "now": now,
        "ids": None if selection.ids is None else list(selection.ids),
        "topic": selection.topic,
        "older_than": selection.older_than,
        "buried_by": selection.buried_by,
        "error": selection.error_contains,
    }


def _stored(r: Any) -> StoredMessage:
    """A row of message_get, message_list or buried_list (the same columns)."""
    payload = r[2].encode()
    message = Message(
        id=r[0],
        topic=r[1],
        payload=payload,
        created_at=r[3],
        attempts=r[4],
        key=r[12],
        headers=r[13] or {},
    )
    return StoredMessage(
        message=message,
        due_at=r[5],
        leased_until=r[6],
        last_error=r[7],
        buried_at=r[8],
        requeues=r[9],
        requeued_at=r[10],
        size=None if payload else r[11],
        parked=bool(r[14]),
    )


def _backlog_entry(
    topic: str,
    pending: int,
    buried: int,
    oldest: str | None,
    blocked: int | None = None,  # absent from an older release's measurement
    since: str | None = None,
) -> TopicStats:
    return TopicStats(topic, pending, buried, _instant(oldest), blocked, _instant(since))


def _instant(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text)


def _measured(row: Any, blocked: bool) -> TopicStats:
    if blocked:
        topic, pending, buried, oldest, keys, since, later = row
        return TopicStats(topic, pending, buried, oldest, keys, since, due_later=later)
    topic, pending, buried, oldest = row
    return TopicStats(topic, pending, buried, oldest, blocked_keys=None)


def _with_due_later(stats: list[TopicStats], later: dict[str, int] | None) -> list[TopicStats]:
    """``stats`` with the due-later counts kept beside them (None: not kept)."""
    if later is None:
        return stats
    return [dataclasses.replace(s, due_later=int(later.get(s.topic, 0))) for s in stats]


def _topic_params(settings: TopicSettings, now: dt.datetime | None) -> dict[str, Any]:
    validate_topic(settings.topic)
    return {
        "topic": settings.topic,
        "enabled": settings.enabled,
        "handler": settings.handler,
        "config": Jsonb(dict(settings.config)),
        "max_attempts": settings.max_attempts,
        "timeout": settings.timeout,
        "max_in_flight": settings.max_in_flight,
        "source": settings.source,
        "on_buried": settings.on_buried,
        "reroute": settings.reroute,
        "now": now,
    }
