"""A keyed ack and the unpark of its key's next message, against real PostgreSQL:
what a claim parks while the ack waits for it is unparked by that same ack."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from collections.abc import Awaitable, Callable

import anyio
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from outbox import StoreUnavailable, new_message
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.postgres.queries import QUERIES
from outbox.postgres.store import claim_params
from outbox.requests import ClaimRequest
from tests.clock import T0
from tests.contract.test_pipeline import eventually

LEASE = dt.timedelta(minutes=2)
TOPIC = "orders.events"


async def _waiting_on_a_lock(
    conn: psycopg.AsyncConnection[tuple[object, ...]], application: str = "%"
) -> bool:
    """Whether an ack of ``application`` (any: "%") waits for a lock. The suite's
    workers share the database (a schema each): name the session to be sure."""
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE '%%DELETE FROM outbox_messages%%'"
        " AND application_name LIKE %s",
        [application],
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def test_an_ack_unparks_what_a_claim_parked_behind_its_head_while_it_waited(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    await _ack_while_a_claim_parks(pg_store, pg_conninfo)


def test_behind_a_transaction_pooler_an_ack_still_unparks_what_a_claim_parked_meanwhile(
    scratch_db: str,
) -> None:
    from tests.integration.pooler import pgbouncer, warm

    anyio.run(migrate, scratch_db)
    with pgbouncer(scratch_db) as pooled:
        warm(pooled)

        async def run() -> None:
            async with connect_pool(pooled, min_size=1, max_size=4) as pool:
                await _ack_while_a_claim_parks(PostgresStore(pool), scratch_db)

        anyio.run(run)


async def _ack_while_a_claim_parks(store: PostgresStore, claimer_url: str) -> None:
    """A keyed head is acked while another relay's claim, left
    open, has read it FOR KEY SHARE and parked the next message behind it."""
    head, after = (new_message(TOPIC, {"n": n}, T0, key="order-1") for n in range(2))
    async with store.begin() as tx:
        await store.add(tx, head, after)
    [held] = await store.claim(T0, LEASE, 1)
    assert held.id == head.id

    removed: set[object] = set()

    async def ack() -> None:
        removed.update(
            await store.ack_many(
                [held.id],
                tokens=[held.lease],  # type: ignore[list-item]
            )
        )

    async with (
        await psycopg.AsyncConnection.connect(claimer_url) as claimer,
        await psycopg.AsyncConnection.connect(claimer_url, autocommit=True) as watcher,
    ):
        # Another relay's claim, left open: it reads the head FOR KEY SHARE and
        # parks the next message behind it.
        params = claim_params(ClaimRequest(now=T0, lease=LEASE, limit=10), None)
        cur = await claimer.execute(QUERIES["message_claim"], {**params, "token": None})
        assert [r for r in await cur.fetchall() if r[0] is not None] == []
        async with anyio.create_task_group() as tg:
            tg.start_soon(ack)
            await eventually("the ack waits for the claim", lambda: _waiting_on_a_lock(watcher))
            assert not removed
            await claimer.commit()

    assert removed == {head.id}
    [unparked] = await store.claim(T0, LEASE, 10)
    assert unparked.id == after.id, "the parked message is its key's head now"


async def test_an_ack_of_keys_whose_next_messages_the_caller_holds_is_the_fenced_delete_alone(
    pg_store: PostgresStore,
) -> None:
    msgs = [new_message(TOPIC, {"n": n}, T0, key="order-1") for n in range(2)]
    async with pg_store.begin() as tx:
        await pg_store.add(tx, *msgs)
    head, follower = (
        await pg_store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=10, run=10))
    ).messages  # a run: both are ours
    assert [head.id, follower.id] == [m.id for m in msgs]

    stale = await pg_store.ack_many([head.id], tokens=[uuid.uuid4()], keyed=False)
    removed = await pg_store.ack_many([head.id], tokens=[head.lease], keyed=False)  # type: ignore[list-item]

    assert (stale, removed) == (set(), {head.id})
    assert await pg_store.claim(T0, LEASE, 10) == [], "the follower is still held"


async def test_an_ack_answers_with_what_it_removed_and_leaves_no_pairs_behind(
    pg_conninfo: str,
) -> None:
    """The ack's answer is the ids it did not remove; the removed keys it hands
    key_unpark live in its transaction only, so the pooled connection's next
    user reads no pairs (a stale set would unpark nothing wrong, but cost)."""
    await migrate(pg_conninfo)
    async with connect_pool(pg_conninfo, max_size=1) as pool:
        store = PostgresStore(pool)
        unkeyed, keyed_, other = (
            new_message(TOPIC, {"n": 0}, T0),
            new_message(TOPIC, {"n": 1}, T0, key="order-1"),
            new_message(TOPIC, {"n": 2}, T0, key="order-2"),
        )
        async with store.begin() as tx:
            await store.add(tx, unkeyed, keyed_, other)
        held = await store.claim(T0, LEASE, 10)
        assert len(held) == 3

        removed = await store.ack_many(
            [unkeyed.id, keyed_.id, other.id],
            tokens=[uuid.uuid4(), held[0].lease],  # type: ignore[list-item]
        )
        assert removed == {unkeyed.id, keyed_.id, other.id}
        stale = await store.ack_many([unkeyed.id], tokens=[uuid.uuid4()])
        assert stale == set(), "a message already gone is not removed again"

        async with pool.connection() as conn:
            cur = await conn.execute("SELECT current_setting('outbox.unpark', true)")
            assert (await cur.fetchone()) in {(None,), ("",)}


async def test_an_ack_the_relay_gave_up_on_commits_with_its_unpark_or_not_at_all(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    """The relay stops waiting at its deadline. Its cancel may reach the server
    (nothing commits: the head is still held, and the settler's retry acks it)
    or not (the server commits the ack later, and its unpark with it; the
    retry then finds the head gone). Either way the key goes on."""
    head, after = (new_message(TOPIC, {"n": n}, T0, key="order-1") for n in range(2))
    async with pg_store.begin() as tx:
        await pg_store.add(tx, head, after)
    [held] = await pg_store.claim(T0, LEASE, 10)
    assert await pg_store.claim(T0, LEASE, 10) == [], "the next is parked behind the head"
    impatient = PostgresStore(pg_store.pool, deadline=0.5)

    async with await psycopg.AsyncConnection.connect(pg_conninfo) as blocker:
        await blocker.execute(
            "SELECT 1 FROM outbox_messages WHERE id = %s FOR KEY SHARE", [held.id]
        )
        with pytest.raises(StoreUnavailable):
            await impatient.ack_many([held.id], tokens=[held.lease])  # type: ignore[list-item]
        await blocker.rollback()
    retried = await pg_store.ack_many([held.id], tokens=[held.lease])  # type: ignore[list-item]

    assert retried in ({held.id}, set())
    await eventually("the next message unparked", _claims(pg_store, after.id))


# A relay that sent its ack and died: kill -9 sends no cancel.
_ACKER = """
import sys, uuid, anyio
from outbox.postgres import PostgresStore, connect_pool

async def main():
    async with connect_pool(sys.argv[1], max_size=1) as pool:
        ids, token = [uuid.UUID(sys.argv[2])], uuid.UUID(sys.argv[3])
        await PostgresStore(pool).ack_many(ids, tokens=[token])

anyio.run(main)
"""


async def test_an_ack_whose_relay_is_killed_while_it_waits_commits_with_its_unpark(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    """The ack and its unpark reach the server in one transaction: once sent,
    they commit together, whatever becomes of the relay that sent them (a
    second round trip for the unpark would never be sent, and the key would
    wait for the sweep's repair)."""
    head, after = (new_message(TOPIC, {"n": n}, T0, key="order-1") for n in range(2))
    async with pg_store.begin() as tx:
        await pg_store.add(tx, head, after)
    [held] = await pg_store.claim(T0, LEASE, 10)
    assert await pg_store.claim(T0, LEASE, 10) == [], "the next is parked behind the head"

    async with (
        await psycopg.AsyncConnection.connect(pg_conninfo) as blocker,
        await psycopg.AsyncConnection.connect(pg_conninfo, autocommit=True) as watcher,
    ):
        await blocker.execute(
            "SELECT 1 FROM outbox_messages WHERE id = %s FOR KEY SHARE", [held.id]
        )
        name = f"outbox-acker-{uuid.uuid4().hex[:8]}"
        acker = make_conninfo(pg_conninfo, application_name=name)
        relay = await anyio.open_process(
            [sys.executable, "-c", _ACKER, acker, str(held.id), str(held.lease)]
        )
        try:
            await eventually("the ack waits", lambda: _waiting_on_a_lock(watcher, name), limit=30)
        finally:
            relay.kill()  # SIGKILL
            await relay.wait()
        await blocker.rollback()  # the dead relay's ack goes on, on the server

    await eventually("the next message unparked", _claims(pg_store, after.id))
    assert await pg_store.ack_many([held.id], tokens=[held.lease]) == set(), "acked already"  # type: ignore[list-item]


def _claims(store: PostgresStore, message_id: uuid.UUID) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return [m.id for m in await store.claim(T0, LEASE, 10)] == [message_id]

    return check
