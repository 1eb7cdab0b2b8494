"""The Store contract, stated as tests and run against MemoryStore and PostgresStore."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from outbox import Message, NotFound, Store, new_message
from outbox.requests import ClaimRequest
from tests.clock import T0

LEASE = dt.timedelta(minutes=2)
MS = dt.timedelta(milliseconds=1)


async def add(store: Store[Any], *msgs: Message) -> None:
    async with store.begin() as tx:
        await store.add(tx, *msgs)


def msg(topic: str = "orders.placed", at: dt.datetime = T0, **payload: Any) -> Message:
    return new_message(topic, payload or {"to": "a@example.com"}, at)


async def test_claim_returns_committed_message_with_same_bytes(store: Store[Any]) -> None:
    m = new_message("orders.placed", {"to": "zoë@example.com", "n": [1, 2.5, None]}, T0)
    await add(store, m)

    [got] = await store.claim(T0, LEASE, 10)

    assert got.id == m.id
    assert got.topic == m.topic
    assert got.payload == m.payload
    assert got.created_at == m.created_at
    assert got.attempts == 1


async def test_add_takes_several_messages_at_once(store: Store[Any]) -> None:
    msgs = [msg(n=i) for i in range(5)]
    await add(store, *msgs)

    got = await store.claim(T0, LEASE, 10)

    assert {m.id for m in got} == {m.id for m in msgs}


async def test_rolled_back_transaction_leaves_no_message(store: Store[Any]) -> None:
    with pytest.raises(RuntimeError, match="use case failed"):
        async with store.begin() as tx:
            await store.add(tx, msg())
            raise RuntimeError("use case failed")

    assert await store.claim(T0 + dt.timedelta(days=1), LEASE, 10) == []


async def test_message_is_invisible_until_its_transaction_commits(store: Store[Any]) -> None:
    m = msg()
    async with store.begin() as tx:
        await store.add(tx, m)
        assert await store.claim(T0, LEASE, 10) == []
    assert [c.id for c in await store.claim(T0, LEASE, 10)] == [m.id]


async def test_message_is_not_due_before_it_was_created(store: Store[Any]) -> None:
    await add(store, msg(at=T0))

    assert await store.claim(T0 - MS, LEASE, 10) == []
    assert len(await store.claim(T0, LEASE, 10)) == 1


async def test_claim_returns_earliest_due_first_up_to_limit(store: Store[Any]) -> None:
    late, early, middle = (msg(at=T0 + dt.timedelta(seconds=s)) for s in (3, 1, 2))
    await add(store, late, early, middle)
    now = T0 + dt.timedelta(seconds=10)

    first = await store.claim(now, LEASE, 2)
    rest = await store.claim(now, LEASE, 2)

    assert [m.id for m in first] == [early.id, middle.id]
    assert [m.id for m in rest] == [late.id]


async def test_claim_skips_rows_leased_by_another_relay(store: Store[Any]) -> None:
    await add(store, msg())

    assert len(await store.claim(T0, LEASE, 10)) == 1
    assert await store.claim(T0, LEASE, 10) == []
    assert await store.claim(T0 + LEASE - MS, LEASE, 10) == []


async def test_message_of_crashed_relay_is_claimed_again_when_lease_ends(
    store: Store[Any],
) -> None:
    m = msg()
    await add(store, m)
    await store.claim(T0, LEASE, 10)  # this relay dies without acking

    [again] = await store.claim(T0 + LEASE, LEASE, 10)

    assert again.id == m.id
    assert again.attempts == 2
    state = await store.get(m.id)
    assert state.leased_until == T0 + 2 * LEASE


async def test_concurrent_claims_never_overlap_and_return_every_message(
    store: Store[Any],
) -> None:
    msgs = [msg(at=T0 + i * MS, n=i) for i in range(300)]
    await add(store, *msgs)
    now = T0 + dt.timedelta(seconds=1)
    seen: list[list[uuid.UUID]] = [[] for _ in range(6)]

    async def claimer(mine: list[uuid.UUID]) -> None:
        while batch := await store.claim(now, LEASE, 7):
            mine.extend(m.id for m in batch)

    async with anyio.create_task_group() as tg:
        for mine in seen:
            tg.start_soon(claimer, mine)

    every = [i for mine in seen for i in mine]
    assert len(every) == len(set(every)), "a message was claimed twice"
    assert set(every) == {m.id for m in msgs}


async def test_ack_removes_message(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    await store.claim(T0, LEASE, 10)

    assert await store.ack_many([m.id]) == {m.id}

    with pytest.raises(NotFound):
        await store.get(m.id)
    assert await store.claim(T0 + dt.timedelta(days=1), LEASE, 10) == []


async def test_ack_many_removes_batch_and_counts_what_was_there(store: Store[Any]) -> None:
    a, b, c = msg(n=1), msg(n=2), msg(n=3)
    await add(store, a, b, c)
    await store.claim(T0, LEASE, 10)

    removed = await store.ack_many([a.id, b.id, uuid.uuid4()])

    assert removed == {a.id, b.id}
    assert await store.ack_many([]) == set()
    assert (await store.get(c.id)).message.id == c.id
    with pytest.raises(NotFound):
        await store.get(a.id)


async def test_retry_ends_lease_and_makes_message_due_at_given_time(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    await store.claim(T0, LEASE, 10)
    at = T0 + dt.timedelta(seconds=5)

    await store.retry(m.id, at, "smtp: connection refused")

    state = await store.get(m.id)
    assert state.leased_until is None
    assert state.last_error == "smtp: connection refused"
    assert state.due_at == at
    assert await store.claim(at - MS, LEASE, 10) == []
    [again] = await store.claim(at, LEASE, 10)
    assert again.attempts == 2


async def test_retry_can_make_message_due_before_its_lease_would_end(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    await store.claim(T0, LEASE, 10)

    await store.retry(m.id, T0 + dt.timedelta(seconds=1), "boom")

    assert [c.id for c in await store.claim(T0 + dt.timedelta(seconds=1), LEASE, 10)] == [m.id]


async def test_buried_message_is_kept_with_reason_and_never_claimed(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    await store.claim(T0, LEASE, 10)
    buried_at = T0 + dt.timedelta(seconds=1)

    await store.bury(m.id, "550 no such user", at=buried_at)

    assert await store.claim(T0 + dt.timedelta(days=365), LEASE, 10) == []
    state = await store.get(m.id)
    assert state.buried_at == buried_at
    assert state.last_error == "550 no such user"
    assert state.leased_until is None
    assert state.message.payload == m.payload


async def test_bury_without_time_uses_wall_clock(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    before = dt.datetime.now(dt.UTC)

    await store.bury(m.id, "no handler")

    state = await store.get(m.id)
    assert state.buried_at is not None
    assert before <= state.buried_at <= dt.datetime.now(dt.UTC)


@pytest.mark.parametrize("operation", ["retry", "bury", "get"])
async def test_operations_on_missing_id_raise_not_found(store: Store[Any], operation: str) -> None:
    missing = uuid.uuid4()
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "retry": lambda: store.retry(missing, T0, "x"),
        "bury": lambda: store.bury(missing, "x"),
        "get": lambda: store.get(missing),
    }

    with pytest.raises(NotFound) as info:
        await calls[operation]()

    assert info.value.message_id == missing
    assert str(missing) in str(info.value)


async def test_acked_message_cannot_be_acked_again(store: Store[Any]) -> None:
    m = msg()
    await add(store, m)
    assert await store.ack_many([m.id]) == {m.id}

    assert await store.ack_many([m.id, uuid.uuid4()]) == set()  # gone: nothing removed


@pytest.mark.parametrize(("lease", "limit"), [(dt.timedelta(0), 10), (LEASE, 0)])
async def test_claim_rejects_nonsense_arguments(
    store: Store[Any], lease: dt.timedelta, limit: int
) -> None:
    with pytest.raises(ValueError, match="outbox: "):
        await store.claim(T0, lease, limit)


async def test_release_hands_leased_messages_back_without_counting_the_attempt(
    store: Store[Any],
) -> None:
    a, b, buried = msg(n=1), msg(n=2), msg(n=3)
    await add(store, a, b, buried)
    held = {m.id: m for m in await store.claim(T0, LEASE, 10)}
    await store.bury(buried.id, "poison", at=T0)
    later = T0 + dt.timedelta(seconds=3)
    never_added = msg(n=4)

    released = await store.release([held[a.id], held[b.id], held[buried.id], never_added], later)

    assert released == {a.id, b.id}
    assert (await store.get(a.id)).leased_until is None
    assert (await store.get(buried.id)).buried_at == T0
    again = await store.claim(later, LEASE, 10)
    assert sorted(m.id for m in again) == sorted([a.id, b.id])
    assert {m.attempts for m in again} == {1}
    assert await store.release([], later) == set()


async def test_a_claim_stops_once_its_payloads_reach_max_bytes(store: Store[Any]) -> None:
    big = [msg(at=T0 + dt.timedelta(seconds=i), blob="x" * 1000) for i in range(5)]
    await add(store, *big)
    size = len(big[0].payload)

    first = (
        await store.claim_many(
            ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=10, max_bytes=2 * size + 1)
        )
    ).messages
    second = (
        await store.claim_many(ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=10, max_bytes=1))
    ).messages
    rest = await store.claim(T0 + LEASE, LEASE, 10)

    assert [m.id for m in first] == [m.id for m in big[:3]]  # until the bytes before reach it
    assert [m.id for m in second] == [big[3].id]  # the first is always taken
    assert [m.id for m in rest] == [big[4].id]


async def test_headers_come_back_with_the_message_alone_keyed_and_in_a_run(
    store: Store[Any],
) -> None:
    alone = new_message("orders.placed", {}, T0, headers={"X-Tenant": "acme"})
    plain = new_message("orders.placed", {}, T0)
    run = [
        new_message("orders.paid", {"n": n}, T0, key="o-1", headers={"seq": str(n)})
        for n in range(3)
    ]
    await add(store, alone)
    await add(store, plain, *run)

    got = {
        m.id: m.headers
        for m in (
            await store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=10, run=16))
        ).messages
    }

    assert got == {
        alone.id: {"x-tenant": "acme"},
        plain.id: {},
        **{m.id: {"seq": str(n)} for n, m in enumerate(run)},
    }
