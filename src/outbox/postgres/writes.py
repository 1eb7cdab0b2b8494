"""The PostgreSQL store's write-backs: acks, retries, burials and releases of
claimed messages, each to the ring's partition it was claimed from
(outbox.postgres.ring), fenced by its lease; and an operator's unfenced
ack, retry and burial by id. An object PostgresStore holds (``writes``),
running its statements through the store's Statements.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import psycopg

from outbox.errors import NotFound
from outbox.message import Message
from outbox.postgres.queries import QUERIES
from outbox.postgres.ring import STAY, Ring, SlotPicker
from outbox.postgres.statements import Statements
from outbox.requests import Acked, Buried, Outcome, Released, Retried, Settled, Sorted
from outbox.store import message_ids

__all__ = ["WriteBacks"]

_ACK_UNKEYED = QUERIES["message_ack_unkeyed"]
_ACK_RUN = QUERIES["message_ack_run"]
_ACK_RUN_ONE = QUERIES["message_ack_run_one"]
_ACK_KEYED = QUERIES["message_ack_keyed"]
_KEY_UNPARK = QUERIES["key_unpark"]
_RETRY = QUERIES["message_retry"]
_RETRY_MANY = QUERIES["message_retry_many"]
_BURY = QUERIES["message_bury"]
_BURY_MANY = QUERIES["message_bury_many"]
_RELEASE = QUERIES["message_release"]


class WriteBacks:
    """Settlements of claimed messages and an operator's writes by id, run through
    ``statements``; ``slots`` tells the ring's shape when a message carries no
    slot (one this store did not claim)."""

    def __init__(self, statements: Statements, slots: SlotPicker) -> None:
        self.statements = statements
        self.slots = slots

    async def settle(
        self, outcomes: Sequence[Outcome], *, now: dt.datetime | None = None
    ) -> Settled:
        settled = await self._settle(Sorted.of(outcomes), now, None)
        written = (
            len(settled.acked) + len(settled.retried) + len(settled.buried) + len(settled.released)
        )
        if written == len(outcomes):  # as a rule
            return settled
        # A message whose lease ran out may have been moved to the long-stay
        # partition by the ring's rotation: what missed it there is written
        # there (the same fences: a later claim's lease still refuses it).
        moved = [o for o in outcomes if o.message.slot not in (None, STAY)]
        if moved:
            missed = [o for o in moved if o.message.id not in settled.of(o)]
            if missed:
                again = await self._settle(Sorted.of(missed), now, [STAY])
                settled.acked |= again.acked
                settled.retried |= again.retried
                settled.buried |= again.buried
                settled.released |= again.released
        return settled

    async def _settle(
        self, by: Sorted, now: dt.datetime | None, slots: list[int] | None
    ) -> Settled:
        """``by`` where each message was claimed (``slots``: there instead)."""
        if by.kinds() > 1:
            return await self._settle_together(by, now, slots)
        settled = Settled()
        if by.acks:
            settled.acked = await self._acks(by.acks, slots)
        elif by.retries:
            params = _retry_params(by.retries, now, slots or self._slots_of(by.retries))
            settled.retried = {r[0] for r in await self.statements.fetch(_RETRY_MANY, params)}
        elif by.burials:
            params = _bury_params(by.burials, now, slots or self._slots_of(by.burials))
            rows = await self.statements.fetch(_BURY_MANY, params)
            await self.statements.unpark((r[1], r[2]) for r in rows)  # where the topic skips them
            settled.buried = {r[0] for r in rows}
        elif by.releases:
            params = self._release_params(by.releases, now, slots)
            settled.released = {r[0] for r in await self.statements.fetch(_RELEASE, params)}
        return settled

    def _slots_of(self, outcomes: Iterable[Outcome]) -> list[int]:
        """The slots the messages of ``outcomes`` were claimed from (every slot
        when one was not claimed by this store)."""
        found: set[int] = set()
        for o in outcomes:
            slot = o.message.slot
            if slot is None:
                return (self.slots.ring or Ring()).every
            found.add(slot)
        return sorted(found)

    def _release_params(
        self, releases: list[Released], now: dt.datetime | None, slots: list[int] | None
    ) -> dict[str, Any]:
        ids, tokens = message_ids([r.message for r in releases])
        return {"ids": ids, "tokens": tokens, "now": now,
                "slots": slots or self._slots_of(releases)}  # fmt: skip

    async def _acks(self, acks: list[Acked], slots: list[int] | None) -> set[uuid.UUID]:
        """A settlement of acks alone, by the cheapest statement that does them right."""
        ids = [a.message.id for a in acks]
        slots = slots or self._slots_of(acks)
        keyed = [a for a in acks if a.message.key is not None]
        if not keyed:  # the common case: the plain DELETE, unfenced
            [(kept,)] = await self.statements.fetch(_ACK_UNKEYED, {"ids": ids, "slots": slots})
            return _removed(ids, kept)
        # Keyed acks are fenced by their leases (see Acked).
        tokens = _tokens(a.message for a in keyed)
        runs = all(a.run for a in keyed)
        if runs and len(keyed) == len(ids):  # a run's acks alone: no flush to wait for
            if len(ids) == 1 and len(slots) == 1:
                if not tokens:  # never claimed: no lease holds it
                    return set()
                one = {"id": ids[0], "token": next(iter(tokens)), "slot": slots[0]}
                return set(ids) if await self.statements.count(_ACK_RUN_ONE, one) else set()
            params = {"ids": ids, "tokens": list(tokens), "slots": slots}
            return {r[0] for r in await self.statements.fetch(_ACK_RUN, params)}
        params = {"ids": ids, "tokens": list(tokens), "slots": slots}
        if runs:  # this relay holds each key's next message: nothing to unpark
            [(kept, _)] = await self.statements.fetch(_ACK_KEYED, params)
        else:
            kept = await self._ack_and_unpark(params)
        return _removed(ids, kept)

    async def _settle_together(
        self, by: Sorted, now: dt.datetime | None, slots: list[int] | None
    ) -> Settled:
        """Outcomes of more than one kind in one transaction (pipelined: one round
        trip), so a settlement that fails wrote nothing and can be sent again."""
        steps: list[tuple[Any, dict[str, Any]]] = []  # each but key_unpark returns rows
        if by.acks:
            keyed = [a.message for a in by.acks if a.message.key is not None]
            ids = [a.message.id for a in by.acks]
            where = slots or self._slots_of(by.acks)
            steps.append((_ACK_KEYED, {"ids": ids, "tokens": list(_tokens(keyed)), "slots": where}))
            if not all(a.run for a in by.acks if a.message.key is not None):
                steps.append((_KEY_UNPARK, {"pairs": None}))
        if by.retries:
            where = slots or self._slots_of(by.retries)
            steps.append((_RETRY_MANY, _retry_params(by.retries, now, where)))
        if by.burials:
            where = slots or self._slots_of(by.burials)
            steps.append((_BURY_MANY, _bury_params(by.burials, now, where)))
        if by.releases:
            steps.append((_RELEASE, self._release_params(by.releases, now, slots)))

        async def together(conn: psycopg.AsyncConnection[Any]) -> dict[Any, list[Any]]:
            async with conn.pipeline():
                cursors = [await conn.execute(q, p) for q, p in steps]
            return {
                q: await c.fetchall()
                for (q, _), c in zip(steps, cursors, strict=True)
                if q is not _KEY_UNPARK
            }

        rows = await self.statements.rerun(together)
        settled = Settled()
        if by.acks:
            [(kept, _)] = rows[_ACK_KEYED]
            settled.acked = _removed([a.message.id for a in by.acks], kept)
        settled.retried = {r[0] for r in rows.get(_RETRY_MANY, ())}
        buried = rows.get(_BURY_MANY, [])
        settled.buried = {r[0] for r in buried}
        settled.released = {r[0] for r in rows.get(_RELEASE, ())}
        await self.statements.unpark((r[1], r[2]) for r in buried)
        return settled

    async def ack_many(
        self,
        message_ids: Sequence[uuid.UUID],
        *,
        tokens: Collection[uuid.UUID] | None = None,
        keyed: bool = True,
        durable: bool = True,
    ) -> set[uuid.UUID]:
        if not message_ids:
            return set()
        ids = list(message_ids)
        every = (self.slots.ring or Ring()).every  # ids alone: wherever they are
        if not keyed and tokens is None:  # no key among them: the plain DELETE
            [(kept,)] = await self.statements.fetch(_ACK_UNKEYED, {"ids": ids, "slots": every})
            return _removed(ids, kept)
        params = {"ids": ids, "tokens": None if tokens is None else list(tokens), "slots": every}
        if not keyed and not durable:
            return {r[0] for r in await self.statements.fetch(_ACK_RUN, params)}
        if keyed:
            kept = await self._ack_and_unpark(params)
        else:  # the caller holds the next message of each key: nothing to unpark
            [(kept, _)] = await self.statements.fetch(_ACK_KEYED, params)
        return _removed(ids, kept)

    async def _ack_and_unpark(self, params: dict[str, Any]) -> list[uuid.UUID]:
        """message_ack_keyed, then key_unpark of the keys it removed: one
        transaction, one round trip. Returns the ids not removed."""

        async def ack(conn: psycopg.AsyncConnection[Any]) -> list[uuid.UUID]:
            async with conn.pipeline():
                cur = await conn.execute(_ACK_KEYED, params)
                await conn.execute(_KEY_UNPARK, {"pairs": None})
            [(kept, _)] = await cur.fetchall()
            ids: list[uuid.UUID] = kept  # psycopg's list of the uuid[] column
            return ids

        return await self.statements.rerun(ack)

    async def ack(self, message_id: uuid.UUID) -> None:
        # The relay's keyed ack without a lease: removed and unparked together.
        every = (self.slots.ring or Ring()).every
        if await self._ack_and_unpark({"ids": [message_id], "tokens": None, "slots": every}):
            raise NotFound(message_id)

    async def retry(self, message_id: uuid.UUID, at: dt.datetime, reason: str) -> bool:
        await self.statements.change_one(_RETRY, {"id": message_id, "at": at, "reason": reason})
        return True

    async def bury(
        self, message_id: uuid.UUID, reason: str, *, at: dt.datetime | None = None
    ) -> bool:
        rows = await self.statements.fetch(_BURY, {"id": message_id, "at": at, "reason": reason})
        if not rows:
            raise NotFound(message_id)
        await self.statements.unpark(rows)  # where its topic skips buried heads
        return True


def _removed(ids: list[uuid.UUID], kept: list[uuid.UUID]) -> set[uuid.UUID]:
    """The ids an ack removed: those given but the few it ``kept`` (as a rule none)."""
    removed = set(ids)
    removed.difference_update(kept)
    return removed


def _tokens(messages: Iterable[Message]) -> set[uuid.UUID]:
    """The lease tokens of ``messages``: those of one claim share one, so each is
    hashed once, not once a message."""
    tokens: set[uuid.UUID] = set()
    last = None
    for m in messages:
        if m.lease is not last and m.lease is not None:
            tokens.add(m.lease)
            last = m.lease
    return tokens


def _retry_params(
    retries: list[Retried], now: dt.datetime | None, slots: list[int]
) -> dict[str, Any]:
    return {
        "now": now,
        "slots": slots,
        "ids": [r.message.id for r in retries],
        "tokens": [r.message.lease for r in retries],
        "delays": [r.delay for r in retries],
        "reasons": [r.reason for r in retries],
        "counted": [r.counted for r in retries],
    }


def _bury_params(
    burials: list[Buried], now: dt.datetime | None, slots: list[int]
) -> dict[str, Any]:
    return {
        "now": now,
        "slots": slots,
        "ids": [b.message.id for b in burials],
        "tokens": [b.message.lease for b in burials],
        "reasons": [b.reason for b in burials],
    }
