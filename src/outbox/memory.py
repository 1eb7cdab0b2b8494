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
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from outbox.errors import NotFound
from outbox.message import Message
from outbox.store import StoredMessage, check_claim

__all__ = ["MemoryStore", "MemoryTx"]


@dataclasses.dataclass(slots=True)
class _Row:
    message: Message
    due_at: dt.datetime
    leased_until: dt.datetime | None = None
    last_error: str | None = None
    buried_at: dt.datetime | None = None


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

    async def claim(self, now: dt.datetime, lease: dt.timedelta, limit: int) -> list[Message]:
        check_claim(lease, limit)
        due = sorted(
            (r for r in self._rows.values() if r.buried_at is None and r.due_at <= now),
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
        row = self._row(message_id)
        return StoredMessage(
            message=row.message,
            due_at=row.due_at,
            leased_until=row.leased_until,
            last_error=row.last_error,
            buried_at=row.buried_at,
        )

    def _row(self, message_id: uuid.UUID) -> _Row:
        try:
            return self._rows[message_id]
        except KeyError:
            raise NotFound(message_id) from None
