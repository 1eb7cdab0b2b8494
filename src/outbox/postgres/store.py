"""The PostgreSQL store: one table, one partial index, FOR UPDATE SKIP LOCKED.

Producers add messages through their own transaction (``begin()`` or a
connection they already hold), so a message commits or rolls back with the
change it belongs to. Relays claim, ack, retry and bury through the pool.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from outbox.errors import NotFound, StoreUnavailable
from outbox.message import Message, validate_topic
from outbox.postgres.queries import QUERIES
from outbox.store import StoredMessage, TopicSettings, TopicStats, check_claim

__all__ = ["PostgresStore", "connect_pool"]

_INSERT = QUERIES["message_insert"]
_CLAIM = QUERIES["message_claim"]
_ACK = QUERIES["message_ack"]
_ACK_MANY = QUERIES["message_ack_many"]
_RETRY = QUERIES["message_retry"]
_BURY = QUERIES["message_bury"]
_GET = QUERIES["message_get"]
_RELEASE = QUERIES["message_release"]
_BURIED_LIST = QUERIES["buried_list"]
_BURIED_REQUEUE = QUERIES["buried_requeue"]
_BURIED_PURGE = QUERIES["buried_purge"]
_TOPIC_STATS = QUERIES["topic_stats"]
_TOPIC_LIST = QUERIES["topic_list"]
_TOPIC_UPSERT = QUERIES["topic_upsert"]
_TOPIC_DELETE = QUERIES["topic_delete"]


def connect_pool(
    conninfo: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any
) -> psycopg_pool.AsyncConnectionPool:
    """An unopened pool whose connections suit the store (autocommit).

    In autocommit each relay statement is one round trip; ``begin()`` still
    opens a real transaction. Open it with ``async with connect_pool(...) as pool``.
    """
    return psycopg_pool.AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=False,
        **kwargs,
    )


class PostgresStore:
    """A Store over a psycopg AsyncConnectionPool."""

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool) -> None:
        self.pool = pool

    @asynccontextmanager
    async def _translated(self) -> AsyncIterator[None]:
        """Turn 'cannot reach the database' errors into StoreUnavailable.

        A lost connection usually means every idle one in the pool is lost
        too (the server restarted): check them all now, so the next call gets
        a fresh connection instead of failing once per dead one.
        """
        try:
            yield
        except psycopg.OperationalError as exc:
            with anyio.move_on_after(2):
                with suppress(psycopg.Error):
                    await self.pool.check()
            raise StoreUnavailable(f"outbox: database unavailable: {_first_line(exc)}") from exc
        except psycopg_pool.PoolTimeout as exc:
            raise StoreUnavailable(f"outbox: database unavailable: {_first_line(exc)}") from exc

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection inside a transaction: commit on exit, roll back on error."""
        async with self._translated(), self.pool.connection() as conn, conn.transaction():
            yield conn

    async def add(self, tx: psycopg.AsyncConnection[Any], /, *msgs: Message) -> None:
        """Insert ``msgs`` through ``tx``, which must be inside the caller's transaction."""
        params = [
            {
                "id": m.id,
                "topic": m.topic,
                "payload": m.payload.decode(),
                "created_at": m.created_at,
            }
            for m in msgs
        ]
        if len(params) == 1:
            await tx.execute(_INSERT, params[0])
        elif params:
            # executemany pipelines the inserts: one round trip for the lot.
            async with tx.cursor() as cur:
                await cur.executemany(_INSERT, params)

    async def claim(
        self,
        now: dt.datetime,
        lease: dt.timedelta,
        limit: int,
        *,
        exclude: Collection[str] = (),
    ) -> list[Message]:
        check_claim(lease, limit)
        params = {
            "now": now,
            "leased_until": now + lease,
            "limit": limit,
            "exclude": list(exclude),
        }
        rows = await self._fetch(_CLAIM, params)
        rows.sort(key=lambda r: (r[5], r[0]))
        utc = dt.UTC
        return [
            Message(
                id=r[0],
                topic=r[1],
                payload=r[2].encode(),
                created_at=r[3].astimezone(utc),
                attempts=r[4],
            )
            for r in rows
        ]

    async def ack(self, message_id: uuid.UUID) -> None:
        await self._change_one(_ACK, {"id": message_id})

    async def ack_many(self, message_ids: Sequence[uuid.UUID]) -> int:
        if not message_ids:
            return 0
        return await self._count(_ACK_MANY, {"ids": list(message_ids)})

    async def release(self, message_ids: Sequence[uuid.UUID], now: dt.datetime) -> int:
        if not message_ids:
            return 0
        return await self._count(_RELEASE, {"ids": list(message_ids), "now": now})

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> None:
        await self._change_one(_RETRY, {"id": message_id, "at": at, "reason": reason})

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> None:
        at = at or dt.datetime.now(dt.UTC)
        await self._change_one(_BURY, {"id": message_id, "at": at, "reason": reason})

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        rows = await self._fetch(_GET, {"id": message_id})
        if not rows:
            raise NotFound(message_id)
        return _stored(rows[0])

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        since: dt.datetime | None = None,
        limit: int = 100,
    ) -> list[StoredMessage]:
        params = {"topic": topic, "since": since, "limit": limit}
        return [_stored(r) for r in await self._fetch(_BURIED_LIST, params)]

    async def requeue(
        self,
        now: dt.datetime,
        *,
        ids: Sequence[uuid.UUID] | None = None,
        topic: str | None = None,
        dry_run: bool = False,
    ) -> list[uuid.UUID]:
        params = {"now": now, "ids": None if ids is None else list(ids), "topic": topic}
        # A dry run is the same statement, rolled back: it cannot disagree.
        async with (
            self._translated(),
            self.pool.connection() as conn,
            conn.transaction(force_rollback=dry_run),
        ):
            cur = await conn.execute(_BURIED_REQUEUE, params)
            return [r[0] for r in await cur.fetchall()]

    async def purge_buried(
        self, before: dt.datetime, *, topic: str | None = None, dry_run: bool = False
    ) -> int:
        async with (
            self._translated(),
            self.pool.connection() as conn,
            conn.transaction(force_rollback=dry_run),
        ):
            cur = await conn.execute(_BURIED_PURGE, {"before": before, "topic": topic})
            return cur.rowcount

    async def topic_stats(self) -> list[TopicStats]:
        return [TopicStats(*r) for r in await self._fetch(_TOPIC_STATS, {})]

    async def topics(self) -> dict[str, TopicSettings]:
        return {r[0]: TopicSettings(*r) for r in await self._fetch(_TOPIC_LIST, {})}

    async def set_topic(self, settings: TopicSettings, now: dt.datetime) -> None:
        validate_topic(settings.topic)
        params = {
            "topic": settings.topic,
            "enabled": settings.enabled,
            "handler": settings.handler,
            "config": Jsonb(dict(settings.config)),
            "max_attempts": settings.max_attempts,
            "timeout": settings.timeout,
            "source": settings.source,
            "now": now,
        }
        await self._count(_TOPIC_UPSERT, params)

    async def delete_topic(self, topic: str) -> bool:
        return await self._count(_TOPIC_DELETE, {"topic": topic}) > 0

    async def _fetch(self, query: Any, params: dict[str, Any]) -> list[Any]:
        async with self._translated(), self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def _count(self, query: Any, params: dict[str, Any]) -> int:
        async with self._translated(), self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return cur.rowcount

    async def _change_one(self, query: Any, params: dict[str, Any]) -> None:
        async with self._translated(), self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            if cur.rowcount == 0:
                raise NotFound(params["id"])


def _stored(r: Any) -> StoredMessage:
    return StoredMessage(
        message=Message(id=r[0], topic=r[1], payload=r[2].encode(), created_at=r[3], attempts=r[4]),
        due_at=r[5],
        leased_until=r[6],
        last_error=r[7],
        buried_at=r[8],
        requeues=r[9],
        requeued_at=r[10],
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
