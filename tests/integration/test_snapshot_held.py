"""A snapshot held open is seen: the store names its age, the relay exports it with the
outbox's size and dead rows, never a session's pid or application as a label."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, new_message
from outbox.memory import MemoryStore
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.postgres.claims import claim_params, claim_statement
from outbox.relay.backlog import Backlog
from outbox.relay.config import WATERMARK_SLACK
from outbox.requests import Claimed, ClaimRequest
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


async def test_while_a_snapshot_is_held_claims_read_on_from_a_watermark_and_lose_nothing(
    pg_store: PostgresStore, pg_conninfo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests: list[ClaimRequest] = []
    claim = pg_store.claim_many

    async def noting(request: ClaimRequest) -> Claimed:
        requests.append(request)
        return await claim(request)

    monkeypatch.setattr(pg_store, "claim_many", noting)
    got: list[Message] = []

    async def handle(m: Message) -> None:
        got.append(m)

    monkeypatch.setattr("outbox.relay.core.FULL_LOOK", 0.2)  # the late one, found soon
    relay = Relay(
        pg_store,
        {"orders.placed": handle},
        # Any snapshot counts as held.
        RelayConfig.model_validate({"interval": "50ms", "snapshot_held_after": "0s"}),
        registry=CollectorRegistry(),
        backlog=dt.timedelta(milliseconds=50),
    )
    now = dt.datetime.now(dt.UTC)
    with psycopg.connect(pg_conninfo) as report:  # held throughout
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM outbox_topics").fetchone()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await until("the relay to see the snapshot", lambda: relay._gauges is not None
                        and relay._gauges.held)  # fmt: skip
            first = [new_message("orders.placed", {"n": i}, now) for i in range(50)]
            head, follower = (
                new_message("orders.placed", {"n": i}, now, key="order-7") for i in (50, 51)
            )
            async with pg_store.begin() as tx:
                await pg_store.add(tx, *first, head, follower)
            await until("the first ones", lambda: len(got) >= 52)
            # A transaction that committed late: its messages are due before the
            # watermark the claims have passed.
            late = new_message("orders.placed", {"n": 99}, now - dt.timedelta(hours=1))
            async with pg_store.begin() as tx:
                await pg_store.add(tx, late)
            await until("the late one", lambda: late.id in {m.id for m in got})
            relay.stop()
        report.rollback()

    assert sorted(m.json()["n"] for m in got) == [*range(52), 99]
    assert [m.id for m in got if m.key] == [head.id, follower.id]
    assert any(r.after is not None for r in requests), "no claim read from a watermark"
    assert any(r.after is None for r in requests[1:]), "no full look"


async def until(what: str, predicate: Callable[[], bool]) -> None:
    """Wait (at most 10 s) until ``predicate()`` holds."""
    with anyio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 - the relay has no event for this
            await anyio.sleep(0.01)


async def test_under_a_held_snapshot_a_claim_from_the_watermark_reads_no_more_as_more_is_settled(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    # What the watermark is for, as a structure rather than a timing: every
    # message settled while a snapshot is held leaves an entry in the ready
    # indexes, and one whose lease has ended in the leased rows' index, that
    # no vacuum may remove. A claim from the first entry visits each of them;
    # one from the watermark only those since it. (Time is the claims' own:
    # a batch every ten seconds, leases of a second.)
    base = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    mark: dt.datetime | None = None
    from_mark: list[int] = []
    from_first: list[int] = []
    with psycopg.connect(pg_conninfo) as report:  # held throughout
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM outbox_topics").fetchone()
        for batch in range(5):
            at = base + dt.timedelta(seconds=10 * batch)
            async with pg_store.begin() as tx:
                await pg_store.add(
                    tx,
                    *(
                        new_message("orders.placed", {"n": i}, at + dt.timedelta(milliseconds=i))
                        for i in range(1000)
                    ),
                )
            # Settled as a relay settles them: each claim from the watermark the
            # claim before it found.
            while True:
                claimed = await pg_store.claim_many(_claim(mark, at + 2 * SECOND))
                if not claimed.messages:
                    break
                await pg_store.ack_many([m.id for m in claimed.messages], keyed=False)
                if claimed.last_due is not None:
                    mark = claimed.last_due - WATERMARK_SLACK
            later = at + 9 * SECOND  # every lease of the batch has ended
            from_mark.append(_buffers(pg_conninfo, _claim(mark, later)))
            from_first.append(_buffers(pg_conninfo, _claim(None, later)))
        report.rollback()

    assert from_first[-1] >= 3 * from_first[0], from_first  # what is left unvacuumed
    assert from_mark[-1] <= from_mark[0] + 5, from_mark  # does not grow with it


SECOND = dt.timedelta(seconds=1)


def _claim(after: dt.datetime | None, now: dt.datetime) -> ClaimRequest:
    return ClaimRequest(limit=400, lease=SECOND, now=now, topics=["orders.placed"], after=after)


def _buffers(conninfo: str, request: ClaimRequest) -> int:
    """The shared buffers the store's claim of ``request`` reads (rolled back)."""
    params = claim_params(request, uuid.uuid4())
    with psycopg.connect(conninfo) as conn:
        (plan,) = conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) "
            + claim_statement(params).encode(),
            params,
        ).fetchone() or (None,)
        conn.rollback()
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


class _Scripted:
    """The memory store's backlog, with the storage health a test sets."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.health = StorageHealth(0.0, 0, 0, 0)

    async def topic_stats(self, max_age: dt.timedelta | None = None) -> Any:
        return await self.memory.topic_stats(max_age=max_age)

    async def storage(self) -> StorageHealth:
        return self.health


async def test_claims_keep_to_the_watermark_after_a_release_until_vacuum_has_caught_up() -> None:
    store = _Scripted()
    backlog = Backlog(store, registry=CollectorRegistry())  # type: ignore[arg-type]

    for age, transactions, dead, held in (
        (0.0, 0, 5_000, False),
        (45.0, 900, 20_000, True),  # held: what is deleted stays
        (600.0, 9_000, 1_200_000, True),
        (0.0, 0, 1_200_000, True),  # released, not vacuumed: a look from the first is long
        (0.0, 0, 150_000, True),
        (0.0, 0, 40_000, False),  # vacuumed
    ):
        store.health = StorageHealth(age, transactions, dead, 0)
        await backlog.refresh()
        assert backlog.held is held, (age, dead)
