"""Wake-ups: a commit wakes sleeping relays at once; polling covers whatever is lost.

The relays here poll once a minute, so a delivery within seconds can only
come from a notification. Producers notify after their commit, never in it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, new_message
from outbox.memory import MemoryStore
from outbox.postgres import PostgresStore, add_sync, connect_pool, migrate, producer
from outbox.requests import Claimed, ClaimRequest
from outbox.wake import WAKE_WINDOW, WAKES, Wakes, decode_topics, encode_topics
from tests.integration import recording
from tests.integration.process import RelayProcess, count, wait_until

pytestmark = pytest.mark.postgres_only


def add_through_the_store(db: str, topic: str = recording.TOPIC) -> Message:
    m = new_message(topic, {"n": 1})

    async def go() -> None:
        async with connect_pool(db, max_size=1) as pool:
            store = PostgresStore(pool)
            async with store.begin() as tx:
                await store.add(tx, m)

    anyio.run(go)
    return m


def delivered(db: str, m: Message) -> bool:
    return count(db, f"SELECT count(*) FROM deliveries WHERE message_id = '{m.id}'") == 1


def test_a_commit_wakes_a_relay_that_polls_once_a_minute(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_HANDLERS="tests.integration.recording:handlers",
        OUTBOX_INTERVAL="60s",
        OUTBOX_LOG_LEVEL="debug",
    )
    relays.append(relay)
    relay.wait_ready()
    wait_until("the first, empty poll", lambda: "relay started" in relay.log)
    WAKES.forget()

    for n in range(3):  # each one wakes it again
        m = add_through_the_store(db)
        started = time.monotonic()
        wait_until(f"delivery {n}", functools.partial(delivered, db, m), timeout=20)
        assert time.monotonic() - started < 20  # well inside the minute
        WAKES.forget()


def test_without_a_notification_the_poll_delivers(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_HANDLERS="tests.integration.recording:handlers",
        OUTBOX_INTERVAL="500ms",
    )
    relays.append(relay)
    relay.wait_ready()
    m = new_message(recording.TOPIC, {"n": 2})
    with psycopg.connect(db) as conn, conn.transaction():  # no wake(): nobody is told
        add_sync(conn, m)

    wait_until("the poll's delivery", lambda: delivered(db, m), timeout=20)


def test_a_failed_notification_does_not_fail_the_committed_transaction(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        producer, "NOTIFY", "SELECT pg_notify_is_not_here(%(channel)s, %(payload)s)"
    )
    WAKES.forget()

    m = add_through_the_store(db)

    assert count(db, f"SELECT count(*) FROM outbox_messages WHERE id = '{m.id}'") == 1
    assert WAKES.reserve([recording.TOPIC]) == {recording.TOPIC}  # the failure was handed back


# -- the relay's side: wake() --------------------------------------------------------------


class CountingStore(MemoryStore):
    """A MemoryStore that counts claims."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    async def claim_many(self, request: ClaimRequest) -> Claimed:
        self.claims += 1
        return await super().claim_many(request)


async def _until(what: str, predicate: Any) -> None:
    """Wait (at most 5 s) until ``predicate()`` holds, looking every millisecond."""
    with anyio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - the relay has no event for this
            await anyio.sleep(0.001)


async def test_wake_claims_for_a_served_topic_only_and_looks_again_a_window_later() -> None:
    store = CountingStore()
    got: list[Message] = []

    async def handle(m: Message) -> None:
        got.append(m)

    relay = Relay(
        store,
        {"orders.placed": handle},
        RelayConfig.model_validate({"interval": "60s"}),
        registry=CollectorRegistry(),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _until("the first poll", lambda: store.claims == 1)

        relay.wake({"billing.invoice"})  # not served: stays asleep
        await anyio.sleep(WAKE_WINDOW * 4)
        assert store.claims == 1

        m = new_message("orders.placed", {"n": 1})
        async with store.begin() as tx:
            await store.add(tx, m)
        relay.wake({"orders.placed", "billing.invoice"})
        await _until("the delivery", lambda: [g.id for g in got] == [m.id])
        await _until("the second look, a window later", lambda: store.claims >= 3)
        await anyio.sleep(WAKE_WINDOW * 4)
        assert store.claims == 3  # then asleep again
        relay.stop()


async def test_a_busy_relay_is_not_stampeded_by_wake_ups() -> None:
    store = CountingStore()
    release = anyio.Event()

    async def handle(m: Message) -> None:
        await release.wait()

    relay = Relay(
        store,
        {"orders.placed": handle},
        RelayConfig.model_validate({"interval": "60s", "batch": 2, "concurrency": 2}),
        registry=CollectorRegistry(),
    )
    async with store.begin() as tx:
        await store.add(tx, *(new_message("orders.placed", {"n": i}) for i in range(4)))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _until("every slot busy", lambda: relay.in_flight == 2)
        before = store.claims
        for _ in range(1000):
            relay.wake(None)
            await anyio.lowlevel.checkpoint()
        assert store.claims == before  # no free slot: a wake-up is a note, not a claim
        release.set()
        await _until("the rest delivered", lambda: relay.in_flight == 0 and store.claims > before)
        relay.stop()
    assert store.claims - before <= 4


async def test_a_flood_of_wake_ups_costs_an_idle_relay_one_claim_a_window() -> None:
    store = CountingStore()
    relay = Relay(
        store,
        {"orders.placed": lambda m: anyio.lowlevel.checkpoint()},
        RelayConfig.model_validate({"interval": "60s"}),
        registry=CollectorRegistry(),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _until("the first poll", lambda: store.claims == 1)
        started = anyio.current_time()
        while anyio.current_time() - started < WAKE_WINDOW * 20:
            relay.wake({"orders.placed"})  # a NOTIFY from anyone, as fast as it comes
            await anyio.lowlevel.checkpoint()
        flooded = store.claims - 1
        relay.stop()

    assert 1 <= flooded <= 22


def test_wakes_announce_a_topic_once_a_window() -> None:
    now = [0.0]
    wakes = Wakes(window=0.005, clock=lambda: now[0])
    sent: list[str] = []

    assert wakes.send({"a", "b"}, sent.append) is True
    now[0] = 0.004
    assert wakes.send({"a"}, sent.append) is False  # within the window: a relay looks again
    assert wakes.send({"a", "c"}, sent.append) is True
    now[0] = 0.0051
    assert wakes.send({"a", "b", "c"}, sent.append) is True

    assert sent == ["a,b", "c", "a,b"]


def test_a_failing_notify_is_swallowed_and_handed_back() -> None:
    wakes = Wakes(window=60)

    def broken(payload: str) -> None:
        raise OSError("connection closed")

    assert wakes.send({"a"}, broken) is False
    assert wakes.reserve({"a"}) == {"a"}


@pytest.mark.parametrize(
    ("topics", "payload", "back"),
    [
        ({"b", "a"}, "a,b", {"a", "b"}),
        ({f"t{i:05d}" for i in range(2000)}, "", None),  # too long: any topic
    ],
)
def test_payloads(topics: Collection[str], payload: str, back: set[str] | None) -> None:
    assert encode_topics(frozenset(topics)) == payload
    assert decode_topics(payload) == (frozenset(back) if back is not None else None)


async def test_a_relay_run_from_a_library_is_woken_by_a_commit(pg_store: PostgresStore) -> None:
    got: list[Message] = []

    async def handle(m: Message) -> None:
        got.append(m)

    relay = Relay(
        pg_store,
        {"orders.placed": handle},
        RelayConfig.model_validate({"interval": "60s"}),
        registry=CollectorRegistry(),
    )
    m = new_message("orders.placed", {"n": 1})
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await anyio.sleep(0.5)  # a real LISTEN connection comes up; the first poll finds nothing
        async with pg_store.begin() as tx:  # notifies after the commit
            await pg_store.add(tx, m)
        with anyio.fail_after(5):  # a minute before the next poll
            while not got:  # noqa: ASYNC110 - the handler has no event of its own
                await anyio.sleep(0.01)
        relay.stop()
        tg.cancel_scope.cancel()

    assert [g.id for g in got] == [m.id]


@pytest.mark.parametrize("direct_listener", [False, True])
def test_behind_a_transaction_pooler_a_relay_says_wake_ups_are_off_or_listens_past_it(
    scratch_db: str, relays: list[RelayProcess], tmp_path: Path, direct_listener: bool
) -> None:
    from tests.integration.pooler import pgbouncer, warm

    anyio.run(migrate, scratch_db)
    with pgbouncer(scratch_db) as pooled:
        warm(pooled)
        listen = {"OUTBOX_LISTEN_URL": scratch_db} if direct_listener else {}
        relay = RelayProcess(
            tmp_path,
            OUTBOX_DATABASE_URL=pooled,
            OUTBOX_INTERVAL="60s" if direct_listener else "200ms",
            OUTBOX_LOG_TOPICS="orders.placed",
            **listen,
        )
        relays.append(relay)
        relay.wait_ready()
        time.sleep(1.5)  # the listener's probe waits a second, in a real process
        with psycopg.connect(scratch_db) as conn, producer.transaction_sync(conn):
            add_sync(conn, new_message("orders.placed", {"n": 1}))
        wait_until(
            "the delivery",
            lambda: count(scratch_db, "SELECT count(*) FROM outbox_messages") == 0,
            timeout=10,
        )
        relay.stop()

    off = [r for r in relay.log_records() if r["message"].startswith("wake-ups are off")]
    assert len(off) == (0 if direct_listener else 1)
