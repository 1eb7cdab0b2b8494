"""Inspecting, requeueing and purging buried messages, on every backend."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest

from outbox import Message, Store, new_message
from outbox.store import BuriedCount, BuriedFilter, MessageQuery
from tests.clock import T0

LEASE = dt.timedelta(minutes=2)
H = dt.timedelta(hours=1)


async def buried(store: Store[Any], topic: str, at: dt.datetime, reason: str = "boom") -> Message:
    m = new_message(topic, {"n": str(at)}, T0)
    async with store.begin() as tx:
        await store.add(tx, m)
    await store.claim(T0, LEASE, 100)
    await store.bury(m.id, reason, at=at)
    return m


async def pending(store: Store[Any], topic: str) -> Message:
    m = new_message(topic, {}, T0)
    async with store.begin() as tx:
        await store.add(tx, m)
    return m


async def test_list_buried_is_newest_first_and_filters(store: Store[Any]) -> None:
    old = await buried(store, "mail.a", T0 + H)
    new = await buried(store, "mail.a", T0 + 3 * H)
    other = await buried(store, "mail.b", T0 + 2 * H)
    await pending(store, "mail.a")

    everything = await store.list_buried()
    of_a = await store.list_buried(topic="mail.a")
    recent = await store.list_buried(within=H, now=T0 + 3 * H)
    one = await store.list_buried(limit=1)

    assert [s.message.id for s in everything] == [new.id, other.id, old.id]
    assert [s.message.id for s in of_a] == [new.id, old.id]
    assert [s.message.id for s in recent] == [new.id, other.id]
    assert [s.message.id for s in one] == [new.id]
    assert everything[0].last_error == "boom"
    assert everything[0].message.attempts == 1
    assert everything[0].message.payload == b""  # listing never reads payloads
    assert everything[0].size == len(new.payload)


async def test_requeue_makes_buried_due_now_with_attempts_reset(store: Store[Any]) -> None:
    m = await buried(store, "mail.a", T0, reason="550 no such user")
    now = T0 + 5 * H

    assert await store.requeue(ids=[m.id], now=now) == 1

    state = await store.get(m.id)
    assert state.buried_at is None
    assert state.last_error == "550 no such user"
    assert state.requeues == 1
    assert state.requeued_at == now
    [again] = await store.claim(now, LEASE, 10)
    assert (again.id, again.attempts) == (m.id, 1)


async def test_requeue_is_idempotent_and_never_touches_live_messages(store: Store[Any]) -> None:
    m = await buried(store, "mail.a", T0)
    live = await pending(store, "mail.a")
    now = T0 + H

    first = await store.requeue(ids=[m.id, live.id], now=now)
    second = await store.requeue(ids=[m.id, live.id], now=now)

    assert first == 1
    assert second == 0
    assert (await store.get(live.id)).requeues == 0


async def test_requeue_by_topic_or_all(store: Store[Any]) -> None:
    a1 = await buried(store, "mail.a", T0)
    a2 = await buried(store, "mail.a", T0 + H)
    b = await buried(store, "mail.b", T0)

    assert await store.requeue(topic="mail.a", now=T0) == 2
    assert (await store.get(a1.id)).buried_at is None
    assert (await store.get(a2.id)).buried_at is None
    assert await store.requeue(now=T0) == 1
    assert (await store.get(b.id)).buried_at is None
    assert await store.list_buried() == []


async def test_requeue_and_purge_work_in_batches(store: Store[Any]) -> None:
    for i in range(5):
        await buried(store, "mail.a", T0 + i * dt.timedelta(seconds=1))

    assert await store.requeue(topic="mail.a", now=T0 + H, batch=2) == 5
    assert await store.list_buried() == []
    for _ in range(5):
        await buried(store, "mail.b", T0)
    assert await store.purge_buried(H, now=T0 + 2 * H, batch=2) == 5
    assert await store.list_buried() == []


async def test_dry_runs_change_nothing(store: Store[Any]) -> None:
    m = await buried(store, "mail.a", T0)

    assert await store.requeue(dry_run=True, now=T0 + H) == 1
    assert await store.purge_buried(H, dry_run=True, now=T0 + 2 * H) == 1

    assert (await store.get(m.id)).buried_at == T0


async def test_purge_deletes_only_buried_messages_past_retention(store: Store[Any]) -> None:
    old = await buried(store, "mail.a", T0)
    old_b = await buried(store, "mail.b", T0)
    recent = await buried(store, "mail.a", T0 + 10 * H)
    live = await pending(store, "mail.a")

    assert await store.purge_buried(H, topic="mail.a", now=T0 + 2 * H) == 1
    assert await store.purge_buried(H, now=T0 + 2 * H) == 1

    left = {s.message.id for s in await store.list_buried()}
    assert left == {recent.id}
    assert (await store.get(live.id)).buried_at is None
    assert old.id not in left
    assert old_b.id not in left


async def test_topic_stats_count_backlog_per_topic(store: Store[Any]) -> None:
    await buried(store, "mail.a", T0)
    await pending(store, "mail.a")
    await pending(store, "mail.b")

    stats = {s.topic: s for s in await store.topic_stats()}

    assert (stats["mail.a"].pending, stats["mail.a"].buried) == (1, 1)
    assert (stats["mail.b"].pending, stats["mail.b"].buried) == (1, 0)
    assert stats["mail.a"].oldest_pending == T0
    assert await store.requeue(ids=[uuid.uuid4()], now=T0) == 0


async def test_a_selection_narrows_by_topic_age_error_text_and_ids_together(
    store: Store[Any],
) -> None:
    timeout = await buried(store, "mail.a", T0, "SMTP 421: Timeout talking to relay")
    refused = await buried(store, "mail.a", T0, "550 mailbox refused")
    await buried(store, "mail.a", T0 + 5 * H, "smtp 421: TIMEOUT again")  # recent
    other = await buried(store, "mail.b", T0, "421 timeout")
    await pending(store, "mail.a")
    now = T0 + 6 * H

    def count(**narrow: Any) -> Any:
        return store.count_buried(BuriedFilter(**narrow), now=now)

    assert (await count()).count == 4
    assert (await count(error_contains="timeout")).count == 3  # any case
    assert (await count(error_contains="Timeout", topic="mail.a")).count == 2
    assert (await count(error_contains="timeout", older_than=2 * H)).count == 2
    assert (await count(ids=(timeout.id, refused.id), error_contains="timeout")).count == 1
    assert (await count(error_contains="%")).count == 0, "no pattern characters"
    assert (await count(topic="mail.c")) == BuriedCount(0, None)

    selection = BuriedFilter(topic="mail.a", error_contains="timeout")
    assert await store.requeue(selection=selection, dry_run=True, now=now) == 2
    assert await store.requeue(selection=selection, now=now) == 2
    left = {s.message.id for s in await store.list_buried()}
    assert left == {refused.id, other.id}


async def test_an_action_limited_to_a_dry_runs_newest_burial_acts_on_no_later_one(
    store: Store[Any],
) -> None:
    first = await buried(store, "mail.a", T0, "timeout")
    newest = await buried(store, "mail.a", T0 + H, "timeout")
    found = await store.count_buried(BuriedFilter(error_contains="timeout"), now=T0 + H)
    assert found == BuriedCount(2, T0 + H)
    later = await buried(store, "mail.a", T0 + 2 * H, "timeout")  # after the dry run

    confirmed = BuriedFilter(error_contains="timeout", buried_by=found.as_of)
    assert await store.purge_buried(selection=confirmed, now=T0 + 3 * H) == 2

    left = {s.message.id for s in await store.list_buried()}
    assert left == {later.id}
    assert {first.id, newest.id}.isdisjoint(left)


async def test_a_purge_names_what_it_deletes_and_a_selection_or_arguments_not_both(
    store: Store[Any],
) -> None:
    m = await buried(store, "mail.a", T0)
    with pytest.raises(ValueError, match="older_than or a selection"):
        await store.purge_buried(now=T0 + H)
    with pytest.raises(ValueError, match="not both"):
        await store.requeue(topic="mail.a", selection=BuriedFilter(topic="mail.a"))
    assert (await store.get(m.id)).buried_at == T0, "nothing changed"
    assert await store.purge_buried(selection=BuriedFilter(), now=T0 + H) == 1  # everything


async def test_a_listing_pages_through_messages_by_state_topic_and_key(store: Store[Any]) -> None:
    head = new_message("hook.order", {"n": 0}, T0, key="order-1")
    follower = new_message("hook.order", {"n": 1}, T0, key="order-1")
    async with store.begin() as tx:
        await store.add(tx, head, follower)
    [claimed] = await store.claim(T0, LEASE, 10)  # the follower waits behind its head
    assert claimed.id == head.id
    due = new_message("mail.a", {"code": "918273"}, T0)
    later = new_message("mail.a", {}, T0 + H)
    kept = new_message("mail.b", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, due, later, kept)
    await store.bury(kept.id, "550", at=T0)

    listed = await store.list_messages(MessageQuery(now=T0))
    assert {s.message.id: s.state(T0) for s in listed} == {
        head.id: "in_flight",
        follower.id: "parked",
        due.id: "pending",
        later.id: "due_later",
        kept.id: "buried",
    }
    assert [s.message.id for s in listed] == sorted(s.message.id for s in listed)
    assert all(s.message.payload == b"" for s in listed), "payloads are not read"
    assert {s.size for s in listed if s.message.id == due.id} == {len(due.payload)}
    assert [s.message.key for s in listed if s.message.topic == "hook.order"] == ["order-1"] * 2

    for state, wanted in (("pending", due), ("parked", follower), ("buried", kept)):
        [only] = await store.list_messages(MessageQuery(state=state, now=T0))
        assert only.message.id == wanted.id, state
    assert len(await store.list_messages(MessageQuery(key="order-1", now=T0))) == 2
    assert len(await store.list_messages(MessageQuery(topic="mail.a", now=T0))) == 2

    first = await store.list_messages(MessageQuery(limit=2, now=T0))
    rest = await store.list_messages(MessageQuery(after=first[-1].message.id, limit=500, now=T0))
    assert [s.message.id for s in first + rest] == [s.message.id for s in listed]
    with pytest.raises(ValueError, match="state must be one of"):
        await store.list_messages(MessageQuery(state="sleeping"))
    with pytest.raises(ValueError, match="limit"):
        await store.list_messages(MessageQuery(limit=501))


async def test_a_listing_selects_by_error_text_and_age(store: Store[Any]) -> None:
    old = new_message("hook.order", {}, T0 - 2 * H)
    young = new_message("hook.order", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, old, young)
    await store.bury(old.id, "Receiver TIMED OUT after 10s", at=T0 - H)
    await store.bury(young.id, "400 bad request", at=T0)

    def ids(found: list[Any]) -> set[Any]:
        return {s.message.id for s in found}

    timed_out = MessageQuery(error_contains="timed out", now=T0)
    assert ids(await store.list_messages(timed_out)) == {old.id}
    # Created more than 90 minutes ago; of buried ones, buried more than that ago.
    aged = MessageQuery(older_than=H + H / 2, now=T0)
    assert ids(await store.list_messages(aged)) == {old.id}
    assert ids(await store.list_messages(dataclasses.replace(aged, state="buried"))) == set()
    buried_an_hour = MessageQuery(state="buried", older_than=H / 2, now=T0)
    assert ids(await store.list_messages(buried_an_hour)) == {old.id}
    with pytest.raises(ValueError, match="error text"):
        MessageQuery(error_contains="")


async def test_the_last_backlog_measurement_is_read_without_counting(store: Store[Any]) -> None:
    tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)  # by every store's clock
    async with store.begin() as tx:
        await store.add(tx, new_message("mail.a", {}, T0))
        await store.add(tx, new_message("mail.a", {}, T0, deliver_at=tomorrow))
    counted = await store.topic_stats(max_age=dt.timedelta(minutes=1))  # kept, as a relay's
    measured = await store.backlog_measurement()
    assert measured is not None
    at, stats = measured
    assert [(s.topic, s.pending, s.buried) for s in stats] == [
        (s.topic, s.pending, s.buried) for s in counted
    ]
    assert [s.in_flight for s in stats] == [0]
    assert [(s.pending, s.due_later) for s in stats] == [(2, 1)]
    assert at.tzinfo is not None
    assert await store.may_change() is True, "the tests' own role may do everything"


async def test_buried_ones_are_listed_newest_burial_first(store: Store[Any]) -> None:
    msgs = [new_message("hook.order", {"n": n}, T0) for n in range(5)]
    async with store.begin() as tx:
        await store.add(tx, *msgs)
    for n, m in enumerate(msgs):  # buried in the reverse of their ids' order, then one more
        await store.bury(m.id, "500", at=T0 + dt.timedelta(minutes=10 - n))
    first = await store.list_messages(MessageQuery(state="buried", limit=2, now=T0))
    assert [s.message.id for s in first] == [msgs[0].id, msgs[1].id]
    rest = await store.list_messages(
        MessageQuery(state="buried", after=first[-1].message.id, limit=10, now=T0)
    )
    assert [s.message.id for s in rest] == [m.id for m in msgs[2:]]


async def test_due_ones_are_listed_as_relays_claim_them(store: Store[Any]) -> None:
    """Pending and due-later listings read in due order, then id, and page on
    from the last one's due time even once it was delivered."""
    late_first = new_message("mail.a", {"n": 0}, T0, deliver_at=T0 + dt.timedelta(minutes=3))
    soon = [new_message("mail.a", {"n": n}, T0 + dt.timedelta(seconds=n)) for n in range(1, 4)]
    async with store.begin() as tx:
        await store.add(tx, late_first, *soon)
    now = T0 + dt.timedelta(minutes=5)
    first = await store.list_messages(MessageQuery(state="pending", limit=2, now=now))
    assert [s.message.id for s in first] == [soon[0].id, soon[1].id]
    await store.ack(soon[1].id)  # delivered meanwhile: the next page still follows it
    last = first[-1]
    rest = await store.list_messages(
        MessageQuery(
            state="pending", after=last.message.id, after_due=last.due_at, limit=10, now=now
        )
    )
    assert [s.message.id for s in rest] == [soon[2].id, late_first.id]
    soon_after = T0 + dt.timedelta(seconds=10)
    [later] = await store.list_messages(MessageQuery(state="due_later", now=soon_after))
    assert later.message.id == late_first.id
