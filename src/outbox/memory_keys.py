"""The memory store's rows and its ordering per key: heads, runs, blocked keys.

KeyOrder is a component MemoryStore (outbox.memory) holds: it reads the
store's rows and topic registry (the same dicts) and decides, at each claim,
which message of a key may go, as PostgresStore's parking does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from outbox.message import Message
from outbox.store import BlockedKey, StoredMessage, TopicSettings

__all__ = ["KeyOrder", "Row"]


@dataclasses.dataclass(slots=True)
class Row:
    message: Message
    due_at: dt.datetime
    leased_until: dt.datetime | None = None
    token: uuid.UUID | None = None
    solo: bool = False
    last_error: str | None = None
    buried_at: dt.datetime | None = None
    requeues: int = 0
    requeued_at: dt.datetime | None = None
    seq: int = 0
    """Order of addition (keyed messages are delivered in it)."""

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


class KeyOrder:
    """Ordering per key over ``rows`` (by id) and the topic registry ``topics``."""

    def __init__(self, rows: dict[uuid.UUID, Row], topics: dict[str, TopicSettings]) -> None:
        self._rows = rows
        self._topics = topics

    def heads(self, r: Row, now: dt.datetime) -> bool:
        """Whether no earlier message of ``r``'s key is still to deliver (none
        unacked, or buried where the topic does not skip buried messages), and
        no later one is in flight."""
        key = r.message.key
        if key is None:
            return True
        skip = self._skips(r.message.topic)
        return not any(
            o.message.key == key
            and o.message.topic == r.message.topic
            and (
                (o.seq < r.seq and (o.buried_at is None or not skip))
                # A requeued message waits while a later one of its key is in
                # flight (the key went on past it; PostgresStore parks it).
                or (o.seq > r.seq and o.leased_until is not None and o.leased_until > now)
            )
            for o in self._rows.values()
        )

    def run(
        self,
        claimed: list[Message],
        run: int,
        limit: int,
        max_bytes: int | None,
        now: dt.datetime,
        until: dt.datetime,
        token: uuid.UUID,
    ) -> None:
        """Lease the next messages of each claimed key head (see ClaimRequest.run)."""
        room = limit - len(claimed)
        size = sum(len(m.payload) for m in claimed)
        for head in [m for m in claimed if m.key is not None]:
            seq = self._rows[head.id].seq
            later = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.message.topic == head.topic and r.message.key == head.key
                    and r.seq > seq
                ),
                key=lambda r: r.seq,
            )[:run]  # fmt: skip
            for row in later:
                waiting = row.buried_at is None and row.leased_until is None
                if room <= 0 or not waiting or row.due_at > now:
                    break
                if max_bytes is not None and size + len(row.message.payload) > max_bytes:
                    return
                row.message = dataclasses.replace(
                    row.message, attempts=row.message.attempts + 1, lease=token
                )
                row.leased_until, row.token, row.solo = until, token, False
                claimed.append(row.message)
                room -= 1
                size += len(row.message.payload)

    def blocked(self, *, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        keys: dict[tuple[str, str], list[Row]] = {}
        for r in sorted(self._rows.values(), key=lambda r: r.seq):
            m = r.message
            if m.key is not None and (topic is None or m.topic == topic):
                keys.setdefault((m.topic, m.key), []).append(r)
        found = []
        for (t, k), rows in keys.items():
            live = [r for r in rows if r.buried_at is None or not self._skips(t)]
            if not live or not any(self._waits(r) for r in live[1:]):
                continue
            head = live[0]
            if head.buried_at is None and head.last_error is None:
                continue
            since = head.buried_at or head.message.created_at
            waiting = sum(self._waits(r) for r in live[1:])
            found.append(
                BlockedKey(t, k, head.message.id, since, head.last_error,
                           head.buried_at is not None, waiting)
            )  # fmt: skip
        return sorted(found, key=lambda b: (b.since, b.topic, b.key))[:limit]

    def _skips(self, topic: str) -> bool:
        entry = self._topics.get(topic)
        return entry is not None and entry.on_buried == "skip"

    @staticmethod
    def _waits(r: Row) -> bool:
        """Whether ``r`` waits for its key (not buried, not in flight)."""
        return r.buried_at is None and r.leased_until is None
