"""The ring of partitions (outbox.postgres.ring) against a real PostgreSQL: the
rotation moves what waits, once, and empties a slot with TRUNCATE only when
nothing is in it; a write-back finds a message the rotation moved; a holder
of the outbox's locks (pg_dump) makes the rotation skip, never wait."""

from __future__ import annotations

import datetime as dt
import time

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import PostgresStore
from outbox.postgres.ring import STAY, Ring
from outbox.requests import Acked
from tests.clock import T0

pytestmark = pytest.mark.postgres_only

LEASE = dt.timedelta(seconds=30)
RING = Ring()


def emptying(slot: int, after: dt.datetime) -> dt.datetime:
    """The first time from ``after`` at which the rotation may empty ``slot``."""
    at = after
    while slot not in RING.emptiable(at.timestamp()):
        at += dt.timedelta(seconds=1)
    return at


async def into_slot(store: PostgresStore, slot: int) -> None:
    """Put every message in ring ``slot``, as if inserted during its turn."""
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE outbox_messages SET slot = %s WHERE slot <> %s", (slot, slot))


async def where(store: PostgresStore) -> dict[int, int]:
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT slot, count(*) FROM outbox_messages GROUP BY slot")
        return dict(await cur.fetchall())


async def size(store: PostgresStore, slot: int) -> int:
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT pg_relation_size(%s::regclass)", (f"outbox_messages_{slot}",)
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def relfilenode(store: PostgresStore, slot: int) -> int:
    """What a TRUNCATE changes: the file the partition is stored in."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT relfilenode FROM pg_class WHERE oid = %s::regclass",
            (f"outbox_messages_{slot}",),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_the_rotation_moves_what_waits_once_and_empties_the_slot_when_nothing_is_left(
    pg_store: PostgresStore,
) -> None:
    async with pg_store.begin() as tx:
        await pg_store.add(
            tx,
            new_message("orders.placed", {"n": 0}, T0),
            new_message("orders.placed", {"n": 1}, T0 + dt.timedelta(seconds=1)),
            new_message("orders.placed", {"n": 2}, T0 + dt.timedelta(seconds=2)),
            new_message("orders.keyed", {"n": 3}, T0 + dt.timedelta(seconds=3), key="k"),
            new_message("orders.keyed", {"n": 4}, T0 + dt.timedelta(seconds=4), key="k"),
            new_message("orders.placed", {"n": 5}, T0 + dt.timedelta(hours=1)),  # due later
        )
    await into_slot(pg_store, 1)
    long = dt.timedelta(minutes=5)
    [flying] = await pg_store.claim(T0, long, 1)  # in flight, its lease holds
    assert flying.slot == 1
    [buried] = [m for m in await pg_store.claim(T0 + dt.timedelta(seconds=1), long, 1)]
    await pg_store.bury(buried.id, "kept for an operator")

    at = emptying(1, T0 + dt.timedelta(seconds=5))
    assert await pg_store.rotate(now=at) == 5  # all but the one in flight
    assert await where(pg_store) == {1: 1, STAY: 5}
    assert await size(pg_store, 1) > 0, "a message in flight keeps its slot"
    assert await pg_store.rotate(now=at) == 0  # each is moved once

    settled = await pg_store.settle([Acked(flying)])
    assert settled.acked == {flying.id}
    await pg_store.rotate(now=at)
    assert await size(pg_store, 1) == 0, "the empty slot was truncated"
    assert await where(pg_store) == {STAY: 5}
    emptied = await relfilenode(pg_store, 1)
    await pg_store.rotate(now=at)
    assert await relfilenode(pg_store, 1) == emptied, "an emptied slot is not truncated again"

    # Nothing moved is lost, and a key keeps its order.
    later = at + dt.timedelta(minutes=1)
    got = await pg_store.claim(later, LEASE, 10)
    assert [m.json()["n"] for m in got] == [2, 3]  # the key's second waits for its first
    assert all(m.slot == STAY for m in got)
    assert [s.message.id for s in await pg_store.list_buried()] == [buried.id]
    await pg_store.settle([Acked(m) for m in got])
    assert [m.json()["n"] for m in await pg_store.claim(later, LEASE, 10)] == [4]


async def test_a_write_back_finds_a_message_the_rotation_moved_after_its_lease_ran_out(
    pg_store: PostgresStore,
) -> None:
    async with pg_store.begin() as tx:
        await pg_store.add(tx, new_message("orders.placed", {"n": 0}, T0))
    await into_slot(pg_store, 1)
    [stale] = await pg_store.claim(T0, dt.timedelta(seconds=1), 1)
    at = emptying(1, T0 + dt.timedelta(seconds=2))
    assert await pg_store.rotate(now=at) == 1  # an orphan: its lease ended
    assert await where(pg_store) == {STAY: 1}

    settled = await pg_store.settle([Acked(stale)])  # the relay was slow, not dead

    assert settled.acked == {stale.id}
    assert await where(pg_store) == {}


async def test_a_holder_of_the_outboxs_locks_makes_the_rotation_skip_and_no_one_waits(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    async with pg_store.begin() as tx:
        await pg_store.add(tx, new_message("orders.placed", {"n": 0}, T0))
    await into_slot(pg_store, 1)
    [m] = await pg_store.claim(T0, LEASE, 1)
    await pg_store.settle([Acked(m)])
    at = emptying(1, T0)
    with psycopg.connect(pg_conninfo) as dump:  # pg_dump reads every table of the outbox
        dump.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        dump.execute("SELECT count(*) FROM outbox_messages").fetchone()
        started = time.monotonic()
        await pg_store.rotate(now=at)
        async with pg_store.begin() as tx:  # a producer meanwhile
            await pg_store.add(tx, new_message("orders.placed", {"n": 1}, T0))
        assert time.monotonic() - started < 2, "the rotation or a producer waited"
        assert await size(pg_store, 1) > 0, "nothing is truncated under a reader's lock"
        dump.rollback()
    await pg_store.settle([Acked(m) for m in await pg_store.claim(at, LEASE, 10)])
    await pg_store.rotate(now=at)  # the next pass empties it
    assert await size(pg_store, 1) == 0
