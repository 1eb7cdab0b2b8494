"""`outbox migrate` while producers write and another session holds the table."""

from __future__ import annotations

import threading
import time
import uuid

import anyio
import psycopg
import pytest

from outbox import new_message
from outbox.postgres import add_sync, migrate
from outbox.postgres.queries import migrations
from tests.integration.process import count, query, run_outbox, run_outbox_within
from tools.upgrade import earlier_release, p99, writing


def test_a_held_lock_never_stalls_producers_and_migrate_gives_up_naming_it(
    pg_conninfo: str,
) -> None:
    anyio.run(migrate, pg_conninfo)
    # Migration 3 (ADD COLUMN, an ACCESS EXCLUSIVE lock) is pending again.
    query(pg_conninfo, "DELETE FROM outbox_schema_migrations WHERE version = 3")
    blocker = psycopg.connect(pg_conninfo)
    blocker.execute("SELECT 1 FROM outbox_messages LIMIT 1")  # idle in transaction now
    [(blocker_pid,)] = blocker.execute("SELECT pg_backend_pid()").fetchall()
    slowest = 0.0
    stop = threading.Event()

    def produce() -> None:
        nonlocal slowest
        with psycopg.connect(pg_conninfo, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                with conn.transaction():
                    add_sync(conn, new_message("orders.placed", {"id": str(uuid.uuid4())}))
                slowest = max(slowest, time.monotonic() - started)
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        started = time.monotonic()
        result = run_outbox("migrate", "--wait", "4s", OUTBOX_DATABASE_URL=pg_conninfo)
        took = time.monotonic() - started
    finally:
        stop.set()
        producer.join(10)
        blocker.close()

    assert result.returncode == 1
    *retries, line = result.stderr.strip().splitlines()
    assert retries
    assert all("a lock is held by" in r and "trying again" in r for r in retries)
    assert line.startswith("outbox migrate: migration 0003_requeue_history: gave up after ")
    assert f"pid {blocker_pid} (idle in transaction" in line
    assert took < 15
    assert slowest < 1.5, f"a producer waited {slowest:.2f}s behind migrate"
    assert count(pg_conninfo, "SELECT count(*) FROM outbox_messages") > 20

    again = run_outbox("migrate", OUTBOX_DATABASE_URL=pg_conninfo)
    assert again.returncode == 0, again.stderr
    assert count(pg_conninfo, "SELECT count(*) FROM outbox_schema_migrations") == len(migrations())


def test_migrate_waits_for_another_run_only_as_long_as_told(pg_conninfo: str) -> None:
    anyio.run(migrate, pg_conninfo)
    holder = psycopg.connect(pg_conninfo, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (0x6F7574626F78,))
    try:
        result = run_outbox("migrate", "--wait", "1s", OUTBOX_DATABASE_URL=pg_conninfo)
    finally:
        holder.close()

    assert result.returncode == 1
    assert "another outbox migrate holds the migration lock" in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "outbox migrate: the migration lock: gave up after 1s waiting for a lock held by pid"
        )
    )


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_behind_a_transaction_pooler_migrate_refuses_before_it_locks_anything(
    scratch_db: str, pool_mode: str
) -> None:
    from tests.integration.pooler import pgbouncer, warm

    with pgbouncer(scratch_db, pool_mode=pool_mode) as pooled:
        warm(pooled)
        result = run_outbox("migrate", "--wait", "5s", OUTBOX_DATABASE_URL=pooled)

    tables = count(scratch_db, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'outbox%'")
    locks = count(
        scratch_db,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    if pool_mode == "session":
        assert result.returncode == 0, result.stderr
        # outbox_messages (the ring's parent, its two slots and the long-stay
        # partition), outbox_ring, and the five tables beside them.
        assert tables == 10
    else:
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == (
            "outbox migrate: this connection's statements run in different server sessions "
            "(a transaction pooler, like PgBouncer with pool_mode=transaction, sits in "
            "between), and migrating needs a session of its own: give migrate a direct or "
            "session-mode URL"
        )
        assert tables == 0
    assert locks == 0, "no migration lock is left behind on a pooled connection"


BACKLOG = 300_000


def test_an_upgrade_from_an_earlier_release_never_stalls_producers(pg_conninfo: str) -> None:
    """The release before migrations 7 and 8 (index builds), a large backlog,
    producers writing and one use case 3 s inside its transaction: the upgrade
    completes and no producer waits a second."""
    earlier_release(pg_conninfo, BACKLOG)
    with writing(pg_conninfo, until_refused=True) as waits:
        result = run_outbox_within(120, "migrate", OUTBOX_DATABASE_URL=pg_conninfo)

    assert result.returncode == 0, result.stderr
    # The index build waited for the open transaction, in steps of lock_timeout.
    assert "trying again" in result.stderr, result.stderr
    applied = count(pg_conninfo, "SELECT count(*) FROM outbox_schema_migrations")
    assert applied == len(migrations())
    invalid = (
        "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
        " WHERE c.relname = 'outbox_messages' AND NOT i.indisvalid"
    )
    assert count(pg_conninfo, invalid) == 0
    assert len(waits) > 50
    assert max(waits) < 1.0, f"a producer waited {max(waits):.2f}s (p99 {p99(waits):.3f}s)"
