"""Fenced leases, the store's own time, orphans and caps, on every backend."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from outbox import Message, NotFound, Store
from outbox.requests import ClaimRequest, Orphans
from tests.clock import T0
from tests.contract.test_store import LEASE, add, msg

SECOND = dt.timedelta(seconds=1)


async def taken_over(store: Store[Any]) -> tuple[Message, Message]:
    """A message claimed by a relay that stalled past its lease, then by another."""
    await add(store, msg())
    [stale] = await store.claim(T0, LEASE, 10)
    [current] = await store.claim(T0 + LEASE, LEASE, 10)
    return stale, current


async def test_two_claims_at_the_same_instant_get_different_leases(store: Store[Any]) -> None:
    await add(store, msg(n=1), msg(n=2))

    [a] = await store.claim(T0, LEASE, 1)
    [b] = await store.claim(T0, LEASE, 1)

    assert a.lease is not None
    assert b.lease is not None
    assert a.lease != b.lease


async def test_a_stale_retry_changes_nothing(store: Store[Any]) -> None:
    stale, _current = await taken_over(store)

    written = await store.retry_many([(stale, SECOND, "timed out")], now=T0 + LEASE)

    assert written == set()
    state = await store.get(stale.id)
    assert state.leased_until == T0 + 2 * LEASE
    assert state.last_error is None
    assert await store.claim(T0 + LEASE + SECOND, LEASE, 10) == []  # nobody else can take it


async def test_a_stale_burial_changes_nothing(store: Store[Any]) -> None:
    stale, _current = await taken_over(store)

    assert await store.bury_many([(stale, "permanent: 550")], now=T0 + LEASE) == set()

    state = await store.get(stale.id)
    assert state.buried_at is None
    assert state.last_error is None


async def test_a_stale_release_changes_nothing(store: Store[Any]) -> None:
    stale, _current = await taken_over(store)

    assert await store.release([stale], T0 + LEASE) == set()

    state = await store.get(stale.id)
    assert state.leased_until == T0 + 2 * LEASE
    assert state.message.attempts == 2


async def test_the_current_holder_writes_back(store: Store[Any]) -> None:
    _stale, current = await taken_over(store)
    other = msg(n=2, at=T0 + LEASE)
    await add(store, other)
    [held] = await store.claim(T0 + LEASE, LEASE, 10)

    assert await store.retry_many([(current, SECOND, "boom")], now=T0 + LEASE) == {current.id}
    assert await store.bury_many([(held, "permanent: no")], now=T0 + LEASE) == {held.id}

    state = await store.get(current.id)
    assert (state.due_at, state.leased_until, state.last_error) == (
        T0 + LEASE + SECOND,
        None,
        "boom",
    )
    assert (await store.get(held.id)).buried_at == T0 + LEASE


async def test_a_write_back_after_the_message_was_delivered_elsewhere_does_not_raise(
    store: Store[Any],
) -> None:
    stale, current = await taken_over(store)
    assert await store.ack_many([current.id]) == {current.id}

    assert await store.retry_many([(stale, SECOND, "late")]) == set()
    assert await store.bury_many([(stale, "late")]) == set()
    assert await store.release([stale]) == set()
    with pytest.raises(NotFound):  # an operator's write is unfenced: it finds nothing
        await store.retry(stale.id, T0, "late")


async def test_a_late_ack_of_a_delivered_message_still_deletes_it(store: Store[Any]) -> None:
    stale, _current = await taken_over(store)

    assert await store.ack_many([stale.id]) == {stale.id}  # delivered: nobody needs to again

    assert await store.claim(T0 + 3 * LEASE, LEASE, 10) == []


async def test_requeue_ends_every_earlier_lease(store: Store[Any]) -> None:
    await add(store, msg())
    [m] = await store.claim(T0, LEASE, 10)
    assert await store.bury_many([(m, "permanent: 550")], now=T0) == {m.id}
    await store.requeue(now=T0 + SECOND)

    assert await store.retry_many([(m, SECOND, "late")], now=T0 + SECOND) == set()
    assert (await store.get(m.id)).buried_at is None


async def test_operator_writes_on_bare_ids_are_not_fenced(store: Store[Any]) -> None:
    stale, _current = await taken_over(store)

    assert await store.retry(stale.id, T0 + 3 * LEASE, "operator says later")
    state = await store.get(stale.id)
    assert (state.due_at, state.last_error) == (T0 + 3 * LEASE, "operator says later")


async def test_without_now_the_store_uses_its_own_clock(store: Store[Any]) -> None:
    wall = dt.datetime.now(dt.UTC)
    past, future = msg(at=wall - SECOND, n=1), msg(at=wall + dt.timedelta(hours=1), n=2)
    await add(store, past, future)

    before = dt.datetime.now(dt.UTC)
    claimed = await store.claim(None, LEASE, 10)
    written = await store.retry_many([(claimed[0], dt.timedelta(minutes=5), "later")])
    after = dt.datetime.now(dt.UTC)

    assert [m.id for m in claimed] == [past.id]  # a message due in an hour is not due
    assert written == {past.id}
    state = await store.get(past.id)
    assert before + dt.timedelta(minutes=5) - SECOND <= state.due_at
    assert state.due_at <= after + dt.timedelta(minutes=5) + SECOND


async def test_isolating_claim_stops_at_an_orphan_and_counts_what_it_left(
    store: Store[Any],
) -> None:
    ahead, orphan, behind = msg(n=0, at=T0 - SECOND), msg(n=1), msg(n=2, at=T0 + SECOND)
    await add(store, orphan)
    await store.claim(T0, LEASE, 1)  # its relay dies
    await add(store, ahead, behind)

    claimed = await store.claim_many(
        ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=10, orphans=Orphans.LEAVE)
    )

    assert [m.id for m in claimed.messages] == [ahead.id]  # nothing behind the orphan goes first
    assert claimed.orphans == 2
    state = await store.get(orphan.id)
    assert state.leased_until == T0 + LEASE  # untouched
    [alone] = (
        await store.claim_many(
            ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=10, orphans=Orphans.ONLY)
        )
    ).messages
    assert alone.id == orphan.id
    assert [
        m.id
        for m in (
            await store.claim_many(
                ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=10, orphans=Orphans.LEAVE)
            )
        ).messages
    ] == [behind.id]


async def test_solo_claim_takes_only_orphans_and_forgives_a_shared_lease(
    store: Store[Any],
) -> None:
    orphan, fresh = msg(n=1), msg(n=2)
    await add(store, orphan, fresh)
    await store.claim(T0, LEASE, 1)  # the orphan's relay dies
    now = T0 + LEASE

    [alone] = (
        await store.claim_many(ClaimRequest(now=now, lease=LEASE, limit=10, orphans=Orphans.ONLY))
    ).messages
    assert alone.id == orphan.id
    assert alone.attempts == 1  # the shared lease that ran out is not counted
    assert (
        await store.claim_many(ClaimRequest(now=now, lease=LEASE, limit=10, orphans=Orphans.ONLY))
    ).messages == []

    # Delivered alone, it killed its relay again: now it counts.
    [again] = (
        await store.claim_many(
            ClaimRequest(now=now + LEASE, lease=LEASE, limit=10, orphans=Orphans.ONLY)
        )
    ).messages
    assert again.attempts == 2


async def test_caps_bound_how_many_of_a_topic_one_claim_takes(store: Store[Any]) -> None:
    slow = [msg("hooks.slow", n=i) for i in range(5)]
    fast = [msg("orders.placed", at=T0 + SECOND, n=i) for i in range(3)]
    await add(store, *slow, *fast)
    now = T0 + dt.timedelta(minutes=1)

    claimed = (
        await store.claim_many(
            ClaimRequest(
                now=now, lease=LEASE, limit=10, topics=["orders.placed"], caps={"hooks.slow": 2}
            )
        )
    ).messages

    assert [m.topic for m in claimed] == ["hooks.slow"] * 2 + ["orders.placed"] * 3
    assert [m.id for m in claimed[:2]] == [m.id for m in sorted(slow, key=lambda m: m.id)[:2]]
    none_left = (
        await store.claim_many(
            ClaimRequest(now=now, lease=LEASE, limit=10, topics=[], caps={"hooks.slow": 0})
        )
    ).messages
    assert none_left == []


@pytest.mark.parametrize("limit", [1, 3])
async def test_caps_and_free_topics_share_the_limit(store: Store[Any], limit: int) -> None:
    await add(store, *(msg("a.capped", n=i) for i in range(3)))
    await add(store, *(msg("b.free", n=i) for i in range(3)))

    claimed = (
        await store.claim_many(
            ClaimRequest(now=T0, lease=LEASE, limit=limit, topics=["b.free"], caps={"a.capped": 3})
        )
    ).messages

    assert len(claimed) == limit
    assert len({m.id for m in claimed}) == limit
    assert all(isinstance(m.lease, uuid.UUID) for m in claimed)


async def test_a_message_whose_relay_died_keeps_its_place_in_line(store: Store[Any]) -> None:
    first = msg(n=0)
    await add(store, first)
    await store.claim(T0, LEASE, 1)  # its relay dies
    backlog = [msg(at=T0 + i * SECOND, n=i) for i in range(1, 6)]
    await add(store, *backlog)

    later = T0 + LEASE
    [again, *rest] = await store.claim(later, LEASE, 10)

    assert again.id == first.id, "the orphan is claimed before what became due after it"
    assert [m.id for m in rest] == [m.id for m in backlog]
    assert (await store.get(first.id)).due_at == T0


async def test_a_released_message_keeps_its_place_in_line(store: Store[Any]) -> None:
    first, second = msg(n=0), msg(at=T0 + SECOND, n=1)
    await add(store, first, second)
    [held] = await store.claim(T0, LEASE, 1)

    await store.release([held], T0 + 2 * SECOND)

    claimed = await store.claim(T0 + 2 * SECOND, LEASE, 10)
    assert [m.id for m in claimed] == [first.id, second.id]
