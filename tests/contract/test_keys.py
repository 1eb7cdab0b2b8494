"""Ordering per key, on every store: a key's messages one at a time, in order."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from outbox import Message, Store, new_message
from outbox.requests import ClaimRequest
from outbox.store import TopicSettings
from tests.clock import T0

LEASE = dt.timedelta(minutes=1)
TOPIC = "orders.events"


async def add(store: Store[Any], *msgs: Message) -> list[Message]:
    async with store.begin() as tx:
        await store.add(tx, *msgs)
    return list(msgs)


def keyed(key: str | None, n: int, at: dt.datetime = T0) -> list[Message]:
    return [new_message(TOPIC, {"n": i}, at, key=key) for i in range(n)]


async def claim(store: Store[Any], at: dt.datetime = T0, limit: int = 10) -> list[Message]:
    return list(await store.claim(at, LEASE, limit))


def ns(msgs: list[Message]) -> list[tuple[str | None, int]]:
    return [(m.key, m.json()["n"]) for m in msgs]


@pytest.mark.parametrize("fenced", [False, True], ids=["any-lease", "by-its-lease"])
async def test_a_key_is_delivered_one_message_at_a_time_in_order(
    store: Store[Any], fenced: bool
) -> None:
    await add(store, *keyed("order-1", 3))  # one transaction: the order given
    for later in keyed("order-1", 2):  # then one after another
        await add(store, new_message(TOPIC, {"n": later.json()["n"] + 3}, T0, key="order-1"))

    seen = []
    while got := await claim(store):
        assert len(got) == 1, "at most one message of a key in flight"
        seen += ns(got)
        assert not await claim(store), "nothing of the key while its head is in flight"
        tokens = {m.lease for m in got if m.lease is not None} if fenced else None
        assert await store.ack_many([m.id for m in got], tokens=tokens) == {m.id for m in got}

    assert seen == [("order-1", n) for n in range(5)]


async def test_other_keys_and_unkeyed_messages_are_never_held_back(store: Store[Any]) -> None:
    await add(store, *keyed("a", 2), *keyed("b", 2), *keyed(None, 3))

    got = await claim(store)

    assert sorted(ns(got), key=str) == sorted(
        [("a", 0), ("b", 0), (None, 0), (None, 1), (None, 2)], key=str
    )


async def test_a_failing_head_holds_its_key_and_its_successors_spend_no_attempts(
    store: Store[Any],
) -> None:
    head, nxt = await add(store, *keyed("k", 2))
    [got] = await claim(store)
    assert got.id == head.id
    await store.retry_many([(got, dt.timedelta(minutes=5), "receiver down")], now=T0)

    assert await claim(store, T0 + dt.timedelta(minutes=1)) == []
    [again] = await claim(store, T0 + dt.timedelta(minutes=5))
    assert (again.id, again.attempts) == (head.id, 2)
    await store.ack_many([again.id])
    [then] = await claim(store, T0 + dt.timedelta(minutes=5))
    assert (then.id, then.attempts) == (nxt.id, 1)


async def test_a_buried_head_blocks_its_key_until_requeued_then_goes_first(
    store: Store[Any],
) -> None:
    head, *rest = await add(store, *keyed("k", 3))
    [got] = await claim(store)
    await store.bury_many([(got, "poison")], now=T0)

    assert await claim(store) == [], "block: the successors wait"
    await store.requeue(ids=[head.id], now=T0)
    order = []
    while got_now := await claim(store, T0 + dt.timedelta(seconds=1)):
        order += [m.id for m in got_now]
        await store.ack_many([m.id for m in got_now])

    assert order == [head.id, *(m.id for m in rest)]


async def test_purging_a_buried_head_lets_its_key_go_on(store: Store[Any]) -> None:
    _, nxt = await add(store, *keyed("k", 2))
    [got] = await claim(store)
    await store.bury_many([(got, "poison")], now=T0)
    assert await claim(store) == []

    assert await store.purge_buried(dt.timedelta(0), now=T0 + dt.timedelta(seconds=1)) == 1

    assert [m.id for m in await claim(store)] == [nxt.id]


async def test_a_topic_that_skips_buried_messages_goes_on_past_them(store: Store[Any]) -> None:
    await store.set_topic(TopicSettings(TOPIC, handler="log", on_buried="skip"))
    head, nxt = await add(store, *keyed("k", 2))
    [got] = await claim(store)
    await store.bury_many([(got, "poison")], now=T0)

    assert [m.id for m in await claim(store)] == [nxt.id]
    assert (await store.get(head.id)).buried_at is not None


async def test_an_orphan_keeps_its_place_in_its_key(store: Store[Any]) -> None:
    head, _ = await add(store, *keyed("k", 2))
    assert [m.id for m in await claim(store)] == [head.id]  # its relay dies with it

    assert await claim(store, T0 + LEASE / 2) == []
    [again] = await claim(store, T0 + LEASE)
    assert (again.id, again.attempts) == (head.id, 2)


async def test_a_head_due_later_delays_its_key_only(store: Store[Any]) -> None:
    later = T0 + dt.timedelta(minutes=10)
    head = new_message(TOPIC, {"n": 0}, T0, key="k", deliver_at=later)
    await add(store, head, new_message(TOPIC, {"n": 1}, T0, key="k"), *keyed("other", 1))

    first = await claim(store)
    assert ns(first) == [("other", 0)]
    await store.ack_many([m.id for m in first])
    assert ns(await claim(store, later)) == [("k", 0)]


async def test_a_key_is_a_string_of_at_most_200_characters() -> None:
    assert new_message(TOPIC, {}, key="k" * 200).key == "k" * 200
    for bad in ["", "k" * 201, "a\x00b", 7]:
        with pytest.raises(ValueError, match="key"):
            new_message(TOPIC, {}, key=bad)  # type: ignore[arg-type]


async def test_blocked_keys_name_their_head_why_and_how_many_wait(store: Store[Any]) -> None:
    poison, *_ = await add(store, *keyed("poisoned", 3))
    failing, *_ = await add(store, *keyed("failing", 2))
    await add(store, *keyed("fine", 2))
    got = {m.key: m for m in await claim(store)}
    await store.bury_many([(got["poisoned"], "550 no such user")], now=T0)
    await store.retry_many([(got["failing"], dt.timedelta(minutes=5), "timeout")], now=T0)

    blocked = await store.keys_blocked()

    # Longest blocked first (both since T0 here), then by topic and key.
    assert [(b.key, b.head, b.buried, b.reason, b.waiting, b.since) for b in blocked] == [
        ("failing", failing.id, False, "timeout", 1, T0),
        ("poisoned", poison.id, True, "550 no such user", 2, T0),
    ]
    assert {b.key for b in await store.keys_blocked(topic="other.topic")} == set()
    await store.set_topic(TopicSettings(TOPIC, handler="log", on_buried="skip"))
    assert [b.key for b in await store.keys_blocked()] == ["failing"]


async def test_a_stale_ack_leaves_a_keyed_message_to_its_current_holder(
    store: Store[Any],
) -> None:
    await add(store, *keyed("order-1", 2))
    [stale] = await claim(store)  # its relay stalls past the lease
    [current] = await claim(store, T0 + LEASE)  # another relay takes the head over
    assert current.id == stale.id

    removed = await store.ack_many([stale.id], tokens=[stale.lease])  # type: ignore[list-item]

    assert removed == set(), "a stale ack must not end the holder's delivery"
    assert await claim(store, T0 + LEASE) == [], "the next waits while the head is held"
    assert await store.ack_many([current.id], tokens=[current.lease]) == {current.id}  # type: ignore[list-item]
    assert ns(await claim(store, T0 + LEASE)) == [("order-1", 1)]


async def test_a_runs_acks_one_at_a_time_are_fenced_by_the_lease(store: Store[Any]) -> None:
    await add(store, *keyed("hot", 4))
    run = list(
        (await store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=10, run=16))).messages
    )  # the head and its run: ours
    assert [m.json()["n"] for m in run] == [0, 1, 2, 3]
    lease = run[0].lease
    assert lease is not None

    def ack(m: Any, tokens: list[Any] | None) -> Any:
        return store.ack_many([m.id], tokens=tokens, keyed=False, durable=False)

    assert await ack(run[0], [uuid.uuid4()]) == set(), "another lease's ack removes nothing"
    assert await ack(run[0], []) == set(), "no lease is no lease"
    assert await ack(run[0], [lease]) == {run[0].id}
    assert await ack(run[1], None) == {run[1].id}, "no tokens: whoever holds it"
    assert await store.ack_many(
        [run[2].id, run[3].id], tokens=[lease], keyed=False, durable=False
    ) == {run[2].id, run[3].id}
    assert await ack(run[0], [lease]) == set(), "gone already"


async def test_a_message_requeued_while_its_key_went_on_waits_for_the_one_in_flight(
    store: Store[Any],
) -> None:
    await store.set_topic(TopicSettings(TOPIC, handler="log", on_buried="skip"))
    await add(store, *keyed("k", 3))
    [first] = await claim(store)
    await store.bury_many([(first, "550")], now=T0)  # skipped: the key goes on
    [second] = await claim(store)
    assert ns([second]) == [("k", 1)]

    assert await store.requeue(ids=[first.id], now=T0) == 1

    assert await claim(store) == [], "one message of a key in flight at a time"
    await store.ack_many([second.id])
    assert ns(await claim(store)) == [("k", 0)], "the requeued message goes next"


async def test_topic_stats_count_each_topics_blocked_keys(store: Store[Any]) -> None:
    await add(store, *keyed("poisoned", 3), *keyed("failing", 2), *keyed("fine", 2))
    got = {m.key: m for m in await claim(store)}
    await store.bury_many([(got["poisoned"], "550 no such user")], now=T0)
    await store.retry_many([(got["failing"], dt.timedelta(minutes=5), "timeout")], now=T0)
    await claim(store)  # parks what waits behind the two heads

    [stats] = await store.topic_stats()
    assert (stats.blocked_keys, stats.oldest_blocked) == (2, T0)
    [unmeasured] = await store.topic_stats(blocked=False)
    assert unmeasured.blocked_keys is None, "a count without the key columns says so"
    assert (unmeasured.pending, unmeasured.buried) == (stats.pending, stats.buried)
    await store.set_topic(TopicSettings(TOPIC, handler="log", on_buried="skip"))
    [skipping] = await store.topic_stats()
    assert skipping.blocked_keys == 1, "a buried head blocks nothing where the topic skips"


async def test_a_claim_may_take_a_keys_next_messages_in_order_after_its_head(
    store: Store[Any],
) -> None:
    msgs = await add(store, *keyed("hot", 5), *keyed(None, 1))
    later = new_message(TOPIC, {"n": 5}, T0, key="hot", deliver_at=T0 + dt.timedelta(hours=1))
    await add(store, later, *keyed("hot", 1))  # not due: the run stops before it

    got = list(
        (await store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=10, run=16))).messages
    )

    assert {m.id for m in got} == {m.id for m in msgs}
    hot = [m.json()["n"] for m in got if m.key == "hot"]
    assert hot == [0, 1, 2, 3, 4], "the key's messages in order, its head first"
    assert await claim(store) == [], "all leased"
    assert (
        len((await store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=3, run=16))).messages)
        == 0
    )
    assert (
        len(
            list(
                (
                    await store.claim_many(
                        ClaimRequest(now=T0 + LEASE, lease=LEASE, limit=2, run=16)
                    )
                ).messages
            )
        )
        == 2
    )  # the limit holds
