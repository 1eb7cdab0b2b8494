"""One relay at a time counts the backlog; the other relays and the controller read its count."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.postgres.operator import BACKLOG_LOCK_KEY as _BACKLOG_LOCK_KEY
from tests.clock import T0

HOUR = dt.timedelta(hours=1)
NOW = dt.timedelta(0)


@pytest.fixture
async def relays(pg_conninfo: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one table, each with a pool of its own, as two relays have."""
    await migrate(pg_conninfo)
    async with (
        connect_pool(pg_conninfo, min_size=1, max_size=2) as a,
        connect_pool(pg_conninfo, min_size=1, max_size=2) as b,
    ):
        yield PostgresStore(a), PostgresStore(b)


async def add(store: PostgresStore, topic: str, at: dt.datetime) -> None:
    async with store.begin() as tx:
        await store.add(tx, new_message(topic, {"code": "493817"}, at))


async def test_a_fresh_count_is_read_by_the_others_instead_of_counted_again(
    relays: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = relays
    await add(a, "mail.a", T0)
    await add(a, "mail.a", T0 + dt.timedelta(minutes=1))
    measured = await a.topic_stats(max_age=HOUR)
    assert [(s.topic, s.pending, s.oldest_pending) for s in measured] == [("mail.a", 2, T0)]

    await add(a, "mail.b", T0)

    assert await b.topic_stats(max_age=HOUR) == measured  # read, not counted: no mail.b
    recounted = await b.topic_stats(max_age=NOW)
    assert recounted == await a.topic_stats()  # a count of its own, which it keeps
    assert [s.topic for s in recounted] == ["mail.a", "mail.b"]
    assert await a.topic_stats(max_age=HOUR) == recounted


async def test_while_one_relay_counts_the_others_read_its_last_count(
    relays: tuple[PostgresStore, PostgresStore], pg_conninfo: str
) -> None:
    a, b = relays
    await add(a, "mail.a", T0)
    first = await a.topic_stats(max_age=HOUR)
    await add(a, "mail.a", T0)

    async with (
        await psycopg.AsyncConnection.connect(pg_conninfo) as counting,
        counting.transaction(),
    ):
        await counting.execute("SELECT pg_advisory_xact_lock(%s)", (_BACKLOG_LOCK_KEY,))
        # Stale, but another relay is counting: the last count will do.
        assert await b.topic_stats(max_age=NOW) == first
        # No count at all yet: one is taken, and not kept.
        async with a.pool.connection() as conn:
            await conn.execute("DELETE FROM outbox_backlog")
        [alone] = await b.topic_stats(max_age=NOW)
        assert alone.pending == 2
        async with a.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM outbox_backlog")
            assert await cur.fetchone() == (0,)

    [kept] = await b.topic_stats(max_age=NOW)
    assert kept.pending == 2
    assert await a.topic_stats(max_age=HOUR) == [kept]


async def test_an_empty_table_counts_as_no_topics(
    relays: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = relays
    assert await a.topic_stats(max_age=HOUR) == []
    assert await b.topic_stats(max_age=HOUR) == []
    await add(a, "mail.a", T0)
    assert await b.topic_stats(max_age=HOUR) == []  # a's count of nothing is fresh
    assert [s.pending for s in await b.topic_stats(max_age=NOW)] == [1]


async def test_a_count_without_blocked_keys_is_not_kept_and_an_older_one_reads_as_unknown(
    relays: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = relays
    await add(a, "mail.a", T0)
    [controllers] = await b.topic_stats(max_age=NOW, blocked=False)  # the controller's count
    assert controllers.blocked_keys is None
    [relays_count] = await a.topic_stats(max_age=HOUR)
    assert relays_count.blocked_keys == 0, "the controller's count was not kept for the fleet"

    # A relay of the release before blocked keys keeps four fields an entry.
    async with a.pool.connection() as conn:
        await conn.execute(
            "UPDATE outbox_backlog SET measured_at = now(),"
            ' stats = \'[["mail.a", 1, 0, "2026-01-01T12:00:00+00:00"]]\''
        )
    [older] = await b.topic_stats(max_age=HOUR)
    assert (older.pending, older.oldest_pending, older.blocked_keys) == (1, T0, None)
