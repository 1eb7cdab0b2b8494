"""A snapshot held open is seen: the store names its age, the relay exports it with the
outbox's size and dead rows, never a session's pid or application as a label."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from outbox import new_message
from outbox.memory import MemoryStore
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.relay.backlog import Backlog
from outbox.store import StorageHealth
from tests.clock import T0
from tests.integration.servers import primary

pytestmark = pytest.mark.postgres_only


async def add(store: PostgresStore, n: int) -> None:
    """``n`` transactions of one message each: each takes a transaction id."""
    for i in range(n):
        async with store.begin() as tx:
            await store.add(tx, new_message("orders.placed", {"n": i}, T0))


def gauge(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


async def test_a_held_snapshot_is_measured_and_exported_until_it_ends(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    registry = CollectorRegistry()
    backlog = Backlog(pg_store, registry=registry)
    await add(pg_store, 1)
    before = await pg_store.storage()
    assert before.size_bytes > 0

    with psycopg.connect(pg_conninfo) as report:  # a report in REPEATABLE READ
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM outbox_topics").fetchone()
        await add(pg_store, 5)

        held = await pg_store.storage()
        await backlog.refresh()

        assert held.oldest_snapshot_transactions >= 5
        assert held.oldest_snapshot_seconds >= 0
        assert gauge(registry, "outbox_oldest_snapshot_transactions") >= 5
        assert gauge(registry, "outbox_storage_bytes") == held.size_bytes
        report.rollback()

    released = await pg_store.storage()
    await backlog.refresh()
    assert released.oldest_snapshot_transactions < 5
    assert gauge(registry, "outbox_oldest_snapshot_transactions") < 5
    samples = [s for m in registry.collect() for s in m.samples if "snapshot" in s.name]
    assert samples
    assert all(s.labels == {} for s in samples)  # no pid, no application: no label at all


async def test_a_prepared_transaction_left_behind_is_a_holder_too() -> None:
    # A server of its own: the shared one allows no prepared transactions.
    with primary(settings="max_prepared_transactions = 2\n") as server:
        url = server.url()
        await migrate(url)
        async with connect_pool(url, max_size=2) as pool:
            store = PostgresStore(pool)
            with psycopg.connect(url) as conn:
                conn.execute("SELECT txid_current()")  # a transaction id of its own
                conn.execute("PREPARE TRANSACTION 'outbox_test_left_behind'")
            await add(store, 3)
            assert (await store.storage()).oldest_snapshot_transactions >= 3
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ROLLBACK PREPARED 'outbox_test_left_behind'")
            assert (await store.storage()).oldest_snapshot_transactions < 3


async def test_the_memory_store_holds_nothing_dead() -> None:
    assert await MemoryStore().storage() == StorageHealth(0.0, 0, 0, 0)
