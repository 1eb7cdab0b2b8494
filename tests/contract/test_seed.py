"""The design's Store contract, whole, on every store: add, claim, ack, retry, bury.

Code written against the design (``claim(now, lease, limit)`` and the writes
by id) runs unchanged on MemoryStore and PostgresStore; the relay's batched,
fenced operations are an extension of it, never a replacement.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from outbox import Message, NotFound, Store, backoff, new_message
from outbox.store import TopicSettings
from tests.clock import T0

LEASE = dt.timedelta(minutes=2)
TOPIC = "mail.login_link"


async def add(store: Store[Any], *msgs: Message) -> None:
    async with store.begin() as tx:
        await store.add(tx, *msgs)


async def test_a_relay_of_the_five_operations_retries_until_delivered(store: Store[Any]) -> None:
    # The design's own test, with the design's own relay: claim, hand to the
    # handler, ack on success, retry after backoff on failure.
    calls: list[int] = []
    delivered: list[uuid.UUID] = []

    async def drain(now: dt.datetime) -> None:
        for m in await store.claim(now, LEASE, 10):
            calls.append(m.attempts)
            if len(calls) < 3:
                await store.retry(m.id, now + backoff(m.attempts), "smtp: connection refused")
            else:
                delivered.append(m.id)
                await store.ack(m.id)

    m = new_message(TOPIC, {"to": "a@example.com"}, T0)
    await add(store, m)
    now = T0
    await drain(now)  # fails, retry in 1s
    await drain(now)  # not due yet
    now += backoff(1)
    await drain(now)  # fails, retry in 2s
    now += backoff(2)
    await drain(now)  # succeeds
    now += dt.timedelta(hours=1)
    await drain(now)  # nothing left

    assert calls == [1, 2, 3]
    assert delivered == [m.id]
    with pytest.raises(NotFound):
        await store.get(m.id)


async def test_claim_of_the_design_returns_a_list_of_messages(store: Store[Any]) -> None:
    m = new_message(TOPIC, {"n": 1}, T0)
    await add(store, m)

    claimed = await store.claim(T0, LEASE, 10)

    assert [c.id for c in claimed] == [m.id]
    assert claimed[0].attempts == 1


async def test_ack_removes_a_message_whoever_holds_it(store: Store[Any]) -> None:
    held, waiting = new_message(TOPIC, {"n": 1}, T0), new_message(TOPIC, {"n": 2}, T0)
    await add(store, held, waiting)
    await store.claim(T0, LEASE, 1)

    await store.ack(held.id)  # leased: an operator's ack needs no lease
    await store.ack(waiting.id)  # never claimed

    assert await store.claim(T0 + dt.timedelta(days=1), LEASE, 10) == []


async def test_ack_of_an_unknown_or_acked_id_raises_not_found(store: Store[Any]) -> None:
    m = new_message(TOPIC, {"n": 1}, T0)
    await add(store, m)
    await store.ack(m.id)
    missing = uuid.uuid4()

    for message_id in (m.id, missing):
        with pytest.raises(NotFound) as info:
            await store.ack(message_id)
        assert info.value.message_id == message_id


async def test_ack_of_a_keys_head_lets_its_next_message_go(store: Store[Any]) -> None:
    first, second = (new_message(TOPIC, {"n": n}, T0, key="user-1") for n in (1, 2))
    await add(store, first, second)
    [head] = await store.claim(T0, LEASE, 10)  # parks `second` behind it
    assert head.id == first.id
    assert await store.claim(T0, LEASE, 10) == []

    await store.ack(first.id)

    assert [m.id for m in await store.claim(T0, LEASE, 10)] == [second.id]


async def test_bury_of_a_keys_head_lets_its_next_message_go_where_the_topic_skips(
    store: Store[Any],
) -> None:
    await store.set_topic(TopicSettings(TOPIC, handler="log", on_buried="skip"))
    first, second = (new_message(TOPIC, {"n": n}, T0, key="user-1") for n in (1, 2))
    await add(store, first, second)
    await store.claim(T0, LEASE, 10)  # parks `second` behind the head

    await store.bury(first.id, "550 no such user")

    assert [m.id for m in await store.claim(T0, LEASE, 10)] == [second.id]


async def test_bury_of_a_keys_head_keeps_the_key_waiting_where_the_topic_blocks(
    store: Store[Any],
) -> None:
    first, second = (new_message(TOPIC, {"n": n}, T0, key="user-1") for n in (1, 2))
    await add(store, first, second)
    await store.claim(T0, LEASE, 10)

    await store.bury(first.id, "550 no such user")

    assert await store.claim(T0 + dt.timedelta(days=1), LEASE, 10) == []
    [blocked] = await store.keys_blocked()
    assert (blocked.key, blocked.head) == ("user-1", first.id)
