"""What only PostgreSQL can show: migrations, the caller's own transaction, the plan."""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import Iterator
from typing import Any

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


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def test_a_claim_steps_over_none_of_the_rows_in_flight(pg_store: PostgresStore) -> None:
    msgs = [new_message("orders.placed", {"n": i}, T0) for i in range(600)]
    async with pg_store.begin() as tx:
        await pg_store.add(tx, *msgs)
    await pg_store.claim(T0, LEASE, 400)  # in flight, at the front of the line
    async with pg_store.pool.connection() as conn:
        await conn.execute("ANALYZE outbox_messages")

    async with pg_store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["message_claim"].encode(),
            {
                "now": T0 + dt.timedelta(seconds=1),
                "lease": LEASE,
                "limit": 10,
                "token": None,
                "topics": ["orders.placed"],
                "capped": ["orders.placed"],
                "caps": [5],
                "isolate": True,
                "solo": False,
            },
        )
        [[[explained]]] = await cur.fetchall()
        raise psycopg.Rollback  # EXPLAIN ANALYZE ran the claim: undo it

    # The scans that look for messages to claim (not the UPDATE's look-ups by id):
    scans = [
        n
        for n in _nodes(explained["Plan"])
        if n.get("Relation Name") == "outbox_messages"
        and n["Node Type"] != "ModifyTable"
        and n.get("Index Name") != "outbox_messages_pkey"
    ]
    assert {n.get("Index Name") for n in scans} == {
        "outbox_messages_ready_idx",
        "outbox_messages_leased_idx",
    }
    for scan in scans:
        # The ready scans read what they return; the leased ones find no orphan.
        assert scan.get("Rows Removed by Filter", 0) == 0, scan
        assert scan["Actual Rows"] <= 10, scan


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
