"""What only PostgreSQL can show: migrations, the caller's own transaction, the plan."""

from __future__ import annotations

import datetime as dt
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from prometheus_client import CollectorRegistry

import outbox
from outbox import Message, Relay, RelayConfig, StoreUnavailable, new_message
from outbox.errors import SchemaMissing, StoreError
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.postgres.claims import claim_statement
from outbox.postgres.connection import KEEPALIVES, connect
from outbox.postgres.queries import migrations
from outbox.postgres.store import BY_TOPIC, claim_params
from outbox.requests import ClaimRequest, Orphans
from tests.clock import T0
from tests.conftest import fresh_schema

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


# A partition of the ring and its indexes read as the table's: outbox_messages_0,
# outbox_messages_stay_ready_idx are outbox_messages, outbox_messages_ready_idx.
_PARTITION = re.compile(r"^outbox_messages_(?:\d+|stay)(?=_|$)")


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    node = dict(plan)
    for name in ("Relation Name", "Index Name"):
        if name in node:
            node[name] = _PARTITION.sub("outbox_messages", node[name])
    yield node
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def explain_claim(
    store: PostgresStore, topics: list[str], **more: Any
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run the claim under EXPLAIN ANALYZE and roll it back: (ids in order, its scans)."""
    now = T0 + dt.timedelta(seconds=1)
    request = ClaimRequest(now=now, lease=LEASE, limit=10, topics=topics, orphans=Orphans.LEAVE)
    params = {**claim_params(request, None), **more}
    claim = claim_statement(params).encode()  # the form the store runs for them
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(claim, params)
        ids = [r[0] for r in await cur.fetchall()]
        raise psycopg.Rollback
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + claim, params)
        [[[explained]]] = await cur.fetchall()
        raise psycopg.Rollback  # EXPLAIN ANALYZE ran the claim: undo it
    # The scans that look for messages to claim (not the UPDATE's look-ups by id):
    scans = [
        n
        for n in _nodes(explained["Plan"])
        if n.get("Relation Name") == "outbox_messages"
        and n["Node Type"] != "ModifyTable"
        and n.get("Index Name") != "outbox_messages_pkey"
        and not n.get("Recheck Cond", "").startswith("(id = ANY")  # a bitmap of those ids
    ]
    return ids, scans


async def _add(store: PostgresStore, topic: str, n: int, at: dt.datetime) -> None:
    async with store.begin() as tx:
        await store.add(tx, *(new_message(topic, {"n": i}, at) for i in range(n)))


@pytest.mark.parametrize("by_topic", [False, True], ids=["in due order", "topic by topic"])
async def test_a_claim_steps_over_none_of_the_rows_in_flight(
    pg_store: PostgresStore, by_topic: bool
) -> None:
    await _add(pg_store, "orders.placed", 600, T0)
    await pg_store.claim(T0, LEASE, 400)  # in flight, at the front of the line
    async with pg_store.pool.connection() as conn:
        await conn.execute("ANALYZE outbox_messages")

    _, scans = await explain_claim(
        pg_store, ["orders.placed"], by_topic=by_topic, capped=["orders.placed"], caps=[5]
    )
    # Unkeyed candidates never run the key's head check.
    keyed = [n for n in scans if n.get("Index Name") == "outbox_messages_key_idx"]
    assert all(n["Actual Loops"] == 0 for n in keyed), keyed
    scans = [n for n in scans if n not in keyed]

    assert {n.get("Index Name") for n in scans} <= {
        "outbox_messages_ready_idx",
        "outbox_messages_topic_ready_idx",
        "outbox_messages_leased_idx",
    }
    for scan in scans:
        # The ready scans read what they return; the leased ones find no orphan.
        assert scan.get("Rows Removed by Filter", 0) == 0, scan
        assert scan["Actual Rows"] <= 10, scan


@pytest.mark.parametrize("topics", [None, ["orders.placed"]], ids=["every topic", "one topic"])
async def test_a_claim_writes_its_rows_by_id_and_never_reads_the_whole_table(
    pg_store: PostgresStore, topics: list[str] | None
) -> None:
    async with pg_store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
            " SELECT gen_random_uuid(), 'orders.placed', '{}', %(at)s, %(at)s"
            " FROM generate_series(1, 20000)",
            {"at": T0},
        )
        await conn.execute("ANALYZE outbox_messages")
    params = claim_params(ClaimRequest(now=T0, lease=LEASE, limit=400, topics=topics), None)
    async with pg_store.pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + claim_statement(params).encode(), params
        )
        [[[explained]]] = await cur.fetchall()
        raise psycopg.Rollback

    read = [
        (
            n["Node Type"],
            (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"],
        )
        for n in _nodes(explained["Plan"])
        if n.get("Relation Name") == "outbox_messages" and n["Node Type"] != "ModifyTable"
    ]
    # The planner's guess of the picked rows once made it hash all 20,000 to
    # update 400 (or compare every pair); each scan reads at most what it claims
    # (a partition of the ring that holds a few rows may be read whole).
    assert all(rows <= 400 for _, rows in read), read


async def test_a_paused_backlog_is_not_walked_and_the_claim_is_the_same(
    pg_store: PostgresStore,
) -> None:
    await _add(pg_store, "billing.paused", 3000, T0 - dt.timedelta(hours=1))  # older, not served
    for i in range(3):  # interleaved in time: the merge must restore the order
        await _add(pg_store, "orders.placed", 5, T0 + dt.timedelta(seconds=i))
        await _add(pg_store, "mail.login_link", 5, T0 + dt.timedelta(seconds=i, milliseconds=5))
    async with pg_store.pool.connection() as conn:
        await conn.execute("ANALYZE outbox_messages")
    served = ["mail.login_link", "orders.placed"]

    in_due_order, _ = await explain_claim(pg_store, served, by_topic=False)
    ids, scans = await explain_claim(pg_store, served, by_topic=True)

    assert ids == in_due_order
    assert len(ids) == 10
    # Each topic's front only: no paused row read, no served row beyond the limit.
    assert {s.get("Index Name") for s in scans if s["Actual Rows"]} == {
        "outbox_messages_topic_ready_idx"
    }
    assert all(s.get("Rows Removed by Filter", 0) == 0 for s in scans)
    assert all(s["Actual Rows"] <= 10 for s in scans)
    async with pg_store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM outbox_messages WHERE topic = ANY(%s) ORDER BY due_at, id LIMIT 10",
            (served,),
        )
        assert ids == [r[0] for r in await cur.fetchall()]


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


async def test_a_relay_of_many_topics_claims_only_those_in_due_order(
    pg_store: PostgresStore,
) -> None:
    served = [f"registry.t{i}" for i in range(BY_TOPIC + 8)]  # past the per-topic reads
    for i, topic in enumerate([*served, "registry.unserved"]):
        await _add(pg_store, topic, 1, T0 - dt.timedelta(seconds=i))

    claimed = (
        await pg_store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=100, topics=served))
    ).messages

    assert [m.topic for m in claimed] == served[::-1]


async def test_two_relays_of_many_topics_claim_each_message_once(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    served = [f"registry.t{i}" for i in range(BY_TOPIC + 8)]  # the hashed sub-select
    for i, topic in enumerate(served * 10):
        await _add(pg_store, topic, 1, T0 - dt.timedelta(milliseconds=i))
    seen: list[list[Any]] = [[], []]

    async def relay(store: PostgresStore, mine: list[Any]) -> None:
        while claimed := (
            await store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=7, topics=served))
        ).messages:
            mine.extend(m.id for m in claimed)
            await store.ack_many([m.id for m in claimed])

    async with (
        connect_pool(pg_conninfo, min_size=1, max_size=2) as other,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(relay, pg_store, seen[0])
        tg.start_soon(relay, PostgresStore(other), seen[1])

    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) + len(seen[1]) == len(served) * 10


async def test_pool_connections_detect_a_dead_peer_unless_the_url_says_otherwise(
    pg_conninfo: str,
) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    own = make_conninfo(pg_conninfo, keepalives_idle="30")
    async with connect_pool(own, max_size=1) as pool, pool.connection() as conn:
        used = conninfo_to_dict(conn.info.dsn)
        # Nothing prepared on the server: safe behind a transaction pooler.
        assert conn.prepare_threshold is None
    async with connect_pool(own, max_size=1, prepare=True) as pool, pool.connection() as conn:
        assert conn.prepare_threshold == 5

    assert (used["keepalives"], used["keepalives_interval"], used["keepalives_count"]) == (
        "1",
        "2",
        "3",
    )
    assert used["tcp_user_timeout"] == "10000"
    assert used["keepalives_idle"] == "30"  # the URL's own value wins
    assert used["connect_timeout"] == "5"
    # Connections outside the pool (migrate, the listener, the startup checks).
    async with await connect(own) as conn:
        alone = conninfo_to_dict(conn.info.dsn)
    assert {k: alone[k] for k in KEEPALIVES} == {**KEEPALIVES, "keepalives_idle": "30"}


def test_every_connection_the_product_opens_detects_a_dead_peer() -> None:
    """Nothing in src/ connects but through connect() or connect_pool()."""
    src = Path(outbox.__file__).parent
    own = src / "postgres" / "connection.py"
    bare = [
        f"{path.relative_to(src)}:{n}"
        for path in src.rglob("*.py")
        if path != own
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(Connection|psycopg)\.connect\(", line)
    ]
    assert not bare, f"connections without dead-peer detection: {bare}"


async def test_a_statement_the_database_does_not_answer_fails_within_the_deadline(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    store = PostgresStore(pg_store.pool, deadline=0.5)
    await _add(store, "orders.placed", 1, T0)
    async with await psycopg.AsyncConnection.connect(pg_conninfo) as blocker:
        await blocker.execute("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
        with anyio.fail_after(3), pytest.raises(StoreUnavailable, match=r"no answer within 0.5s"):
            await store.claim(T0, LEASE, 10)
        cursor = await blocker.execute(
            "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
        )
        abandoned = [pid for (pid,) in await cursor.fetchall()]
        await blocker.rollback()
        # The abandoned claim's backend may still run once the lock is gone:
        # end it (waiting up to 5 s for it to exit) so that its transaction
        # is settled one way or the other before the message is claimed again.
        for pid in abandoned:
            await blocker.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        await blocker.rollback()

    # The abandoned claim may have run on the server once the lock was gone
    # (then its message waits out the lease, as a crashed relay's would):
    # either way the message is claimed again, never lost.
    again = await store.claim(T0, LEASE, 10) or await store.claim(T0 + LEASE, LEASE, 10)
    assert [m.topic for m in again] == ["orders.placed"]


async def test_a_relay_stalled_on_an_unanswered_claim_delivers_once_it_is_answered(
    pg_store: PostgresStore, pg_conninfo: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="outbox")
    store = PostgresStore(pg_store.pool, deadline=0.5)
    delivered = anyio.Event()

    async def handle(m: Message) -> None:
        delivered.set()

    relay = Relay(
        store,
        {"orders.placed": handle},
        # A short lease: the abandoned claim may still have run on the server
        # once the lock went, and its lease must run out for the retry.
        RelayConfig.model_validate({"interval": "50ms", "lease": "2s", "timeout": "1s"}),
        registry=CollectorRegistry(),
    )
    await _add(store, "orders.placed", 1, T0)
    async with await psycopg.AsyncConnection.connect(pg_conninfo) as blocker:
        await blocker.execute("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            with anyio.fail_after(5):
                while "poll failed" not in caplog.text:  # noqa: ASYNC110 - a log line
                    await anyio.sleep(0.01)
            assert relay.alive()
            await blocker.rollback()
            with anyio.fail_after(8):  # the backoff it logged, or the lost claim's lease
                await delivered.wait()
            relay.stop()

    assert "no answer within 0.5s" in caplog.text
    assert "store reachable again" in caplog.text


async def test_a_key_whose_head_went_without_unparking_is_repaired_by_the_sweep(
    pg_store: PostgresStore,
) -> None:
    head, behind = (new_message("orders.events", {"n": n}, T0, key="k") for n in (0, 1))
    async with pg_store.begin() as tx:
        await pg_store.add(tx, head, behind)
    assert [m.id for m in await pg_store.claim(T0, LEASE, 10)] == [head.id]  # parks `behind`
    async with pg_store.pool.connection() as conn:  # its relay died between ack and unpark
        await conn.execute("DELETE FROM outbox_messages WHERE id = %s", (head.id,))
    assert not await pg_store.claim(T0, LEASE, 10)

    await pg_store.bury_unserved(dt.timedelta(minutes=10), now=T0)

    assert [m.id for m in await pg_store.claim(T0, LEASE, 10)] == [behind.id]


async def test_the_stores_database_errors_are_its_own_and_an_applications_stay_psycopgs(
    postgres_url: str, pg_store: PostgresStore
) -> None:
    with fresh_schema(postgres_url) as empty:
        async with connect_pool(empty, min_size=1, max_size=2) as pool:
            unmigrated = PostgresStore(pool)
            with pytest.raises(SchemaMissing, match=r"run `outbox migrate`$") as missing:
                await unmigrated.topics()
            assert isinstance(missing.value.__cause__, psycopg.errors.UndefinedTable)
            with pytest.raises(SchemaMissing):
                await unmigrated.claim(T0, LEASE, 10)

    with pytest.raises(StoreError, match=r"^database error: LIMIT must not be negative$"):
        await pg_store.list_buried(limit=-1)

    # What an application runs in its own transaction is its business: untouched.
    with pytest.raises(psycopg.errors.UndefinedTable):
        async with pg_store.begin() as tx:
            await pg_store.add(tx, new_message("orders.placed", {}, T0))
            await tx.execute("SELECT * FROM no_such_table")
    assert await pg_store.claim(T0, LEASE, 10) == []  # rolled back with it
