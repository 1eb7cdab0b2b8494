"""An in-memory Store for tests of code that uses the outbox.

It keeps the whole contract (tests/contract runs the same suite against it and
PostgreSQL): messages added inside ``begin()`` become visible only when the
block commits, claims lease, buried messages stay. All state lives in one
process and one event loop; every method runs without yielding between its
reads and writes, which is what makes concurrent claims exclusive here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any

from outbox.errors import NotFound
from outbox.message import Message, validate_topic
from outbox.store import StoredMessage, TopicSettings, TopicStats, check_claim

__all__ = ["MemoryStore", "MemoryTx"]


@dataclasses.dataclass(slots=True)
class _Row:
    message: Message
    due_at: dt.datetime
    leased_until: dt.datetime | None = None
    last_error: str | None = None
    buried_at: dt.datetime | None = None
    requeues: int = 0
    requeued_at: dt.datetime | None = None

    def state(self) -> StoredMessage:
        return StoredMessage(
            message=self.message,
            due_at=self.due_at,
            leased_until=self.leased_until,
            last_error=self.last_error,
            buried_at=self.buried_at,
            requeues=self.requeues,
            requeued_at=self.requeued_at,
        )


class MemoryTx:
    """A transaction of a MemoryStore: messages wait here until it commits."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.pending: list[Message] = []
        self.open = True


class MemoryStore:
    """A Store that keeps messages in a dict."""

    def __init__(self) -> None:
        self._rows: dict[uuid.UUID, _Row] = {}
        self._topics: dict[str, TopicSettings] = {}

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
            self._rows[m.id] = _Row(m, due_at=m.created_at)

    async def add(self, tx: MemoryTx, /, *msgs: Message) -> None:
        if tx.store is not self:
            raise ValueError("outbox: transaction belongs to another MemoryStore")
        if not tx.open:
            raise ValueError("outbox: transaction is already finished")
        tx.pending.extend(msgs)

    async def claim(
        self,
        now: dt.datetime,
        lease: dt.timedelta,
        limit: int,
        *,
        exclude: Collection[str] = (),
    ) -> list[Message]:
        check_claim(lease, limit)
        excluded = set(exclude)
        due = sorted(
            (
                r
                for r in self._rows.values()
                if r.buried_at is None and r.due_at <= now and r.message.topic not in excluded
            ),
            key=lambda r: (r.due_at, r.message.id),
        )[:limit]
        until = now + lease
        claimed = []
        for row in due:
            row.message = dataclasses.replace(row.message, attempts=row.message.attempts + 1)
            row.due_at = row.leased_until = until
            claimed.append(row.message)
        return claimed

    async def ack(self, message_id: uuid.UUID) -> None:
        if self._rows.pop(message_id, None) is None:
            raise NotFound(message_id)

    async def ack_many(self, message_ids: Sequence[uuid.UUID]) -> int:
        return sum(self._rows.pop(i, None) is not None for i in set(message_ids))

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> None:
        row = self._row(message_id)
        row.due_at, row.leased_until, row.last_error = at, None, reason

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> None:
        row = self._row(message_id)
        row.buried_at = at or dt.datetime.now(dt.UTC)
        row.leased_until, row.last_error = None, reason

    async def release(self, message_ids: Sequence[uuid.UUID], now: dt.datetime) -> int:
        released = 0
        for message_id in set(message_ids):
            row = self._rows.get(message_id)
            if row is None or row.buried_at is not None:
                continue
            attempts = max(row.message.attempts - 1, 0)
            row.message = dataclasses.replace(row.message, attempts=attempts)
            row.due_at, row.leased_until = now, None
            released += 1
        return released

    async def get(self, message_id: uuid.UUID) -> StoredMessage:
        return self._row(message_id).state()

    async def list_buried(
        self,
        *,
        topic: str | None = None,
        since: dt.datetime | None = None,
        limit: int = 100,
    ) -> list[StoredMessage]:
        rows = [
            r
            for r in self._buried(None, topic)
            if since is None or (r.buried_at is not None and r.buried_at >= since)
        ]
        rows.sort(key=lambda r: (r.buried_at, r.message.id), reverse=True)
        return [r.state() for r in rows[:limit]]

    async def requeue(
        self,
        now: dt.datetime,
        *,
        ids: Sequence[uuid.UUID] | None = None,
        topic: str | None = None,
        dry_run: bool = False,
    ) -> list[uuid.UUID]:
        rows = self._buried(ids, topic)
        if not dry_run:
            for r in rows:
                r.message = dataclasses.replace(r.message, attempts=0)
                r.buried_at, r.leased_until, r.due_at = None, None, now
                r.requeues += 1
                r.requeued_at = now
        return [r.message.id for r in rows]

    async def purge_buried(
        self, before: dt.datetime, *, topic: str | None = None, dry_run: bool = False
    ) -> int:
        old = [r for r in self._buried(None, topic) if r.buried_at and r.buried_at < before]
        if not dry_run:
            for r in old:
                del self._rows[r.message.id]
        return len(old)

    async def topic_stats(self) -> list[TopicStats]:
        stats: dict[str, list[Any]] = {}
        for r in self._rows.values():
            entry = stats.setdefault(r.message.topic, [0, 0, None])
            if r.buried_at is not None:
                entry[1] += 1
                continue
            entry[0] += 1
            if entry[2] is None or r.message.created_at < entry[2]:
                entry[2] = r.message.created_at
        return [TopicStats(topic, *stats[topic]) for topic in sorted(stats)]

    async def topics(self) -> dict[str, TopicSettings]:
        return dict(self._topics)

    async def set_topic(self, settings: TopicSettings, now: dt.datetime) -> None:
        validate_topic(settings.topic)
        self._topics[settings.topic] = dataclasses.replace(
            settings, config=dict(settings.config), updated_at=now
        )

    async def delete_topic(self, topic: str) -> bool:
        return self._topics.pop(topic, None) is not None

    def _buried(self, ids: Sequence[uuid.UUID] | None, topic: str | None) -> list[_Row]:
        wanted = None if ids is None else set(ids)
        return [
            r
            for r in self._rows.values()
            if r.buried_at is not None
            and (wanted is None or r.message.id in wanted)
            and (topic is None or r.message.topic == topic)
        ]

    def _row(self, message_id: uuid.UUID) -> _Row:
        try:
            return self._rows[message_id]
        except KeyError:
            raise NotFound(message_id) from None
