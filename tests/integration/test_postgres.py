"""What only PostgreSQL can show: migrations, the caller's own transaction, the plan."""

from __future__ import annotations

import datetime as dt
import logging
import socket

import anyio
import psycopg
import pytest

from outbox import Relay, RelayConfig, StoreUnavailable, new_message
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.postgres.queries import QUERIES, migrations

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
LEASE = dt.timedelta(minutes=2)


async def test_migrations_apply_from_empty_and_then_do_nothing(pg_conninfo: str) -> None:
    everything = [version for version, _, _ in migrations()]

    assert await migrate(pg_conninfo) == everything
    assert await migrate(pg_conninfo) == []

    async with await psycopg.AsyncConnection.connect(pg_conninfo) as conn:
        cur = await conn.execute("SELECT version FROM outbox_schema_migrations ORDER BY 1")
        assert [r[0] for r in await cur.fetchall()] == everything


async def test_concurrent_migrations_apply_each_version_once(pg_conninfo: str) -> None:
    results: list[list[int]] = []

    async def run() -> None:
        results.append(await migrate(pg_conninfo))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(run)

    applied = sorted(v for r in results for v in r)
    assert applied == [version for version, _, _ in migrations()]


async def test_add_joins_the_callers_own_transaction(pg_store: PostgresStore) -> None:
    async with pg_store.pool.connection() as conn:
        await conn.execute("CREATE TABLE users (email text PRIMARY KEY)")

    async with pg_store.pool.connection() as conn, conn.transaction():
        await conn.execute("INSERT INTO users VALUES ('kept@example.com')")
        await pg_store.add(conn, new_message("mail.welcome", {"to": "kept"}, T0))

    with pytest.raises(psycopg.errors.UniqueViolation):
        async with pg_store.pool.connection() as conn, conn.transaction():
            await pg_store.add(conn, new_message("mail.welcome", {"to": "lost"}, T0))
            await conn.execute("INSERT INTO users VALUES ('kept@example.com')")

    claimed = await pg_store.claim(T0, LEASE, 10)
    assert [m.json() for m in claimed] == [{"to": "kept"}]


async def test_claim_is_served_by_the_partial_index(pg_store: PostgresStore) -> None:
    async with pg_store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(
            b"EXPLAIN " + QUERIES["message_claim"].encode(),
            {
                "now": None,
                "lease": LEASE,
                "limit": 10,
                "token": None,
                "topics": ["orders.placed"],
                "capped": [],
                "caps": [],
                "isolate": True,
                "solo": False,
            },
        )
        plan = "\n".join(r[0] for r in await cur.fetchall())

    assert "outbox_messages_due_idx" in plan
    assert "CTE free" in plan  # MATERIALIZED kept the limited selection fenced


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_database_raises_store_unavailable() -> None:
    conninfo = f"host=127.0.0.1 port={_closed_port()} dbname=x connect_timeout=1"
    async with connect_pool(conninfo, timeout=0.5) as pool:
        store = PostgresStore(pool)
        with pytest.raises(StoreUnavailable, match="database unavailable"):
            await store.claim(T0, LEASE, 10)


async def test_relay_loop_survives_unreachable_database(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conninfo = f"host=127.0.0.1 port={_closed_port()} dbname=x user=u password=hunter2"
    caplog.set_level(logging.INFO, logger="outbox")
    async with connect_pool(conninfo, timeout=0.2) as pool:
        relay = Relay(PostgresStore(pool), {}, RelayConfig.model_validate({"interval": "10ms"}))
        with anyio.move_on_after(1.5):
            await relay.run()

    failures = [r for r in caplog.records if r.getMessage().startswith("poll failed")]
    assert len(failures) == 1, "an outage is said once, not once per poll"
    assert failures[0].levelname == "WARNING"
    assert failures[0].exc_info is None
    assert "hunter2" not in caplog.text
