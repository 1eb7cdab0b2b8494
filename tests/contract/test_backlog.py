"""Backlog gauges follow the store, on every backend."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, Store, new_message
from outbox.relay.backlog import Backlog
from tests.clock import T0


async def test_gauges_count_pending_buried_and_oldest_age(store: Store[Any]) -> None:
    registry = CollectorRegistry()
    now = T0 + dt.timedelta(minutes=5)
    backlog = Backlog(store, clock=lambda: now, registry=registry)
    doomed = new_message("mail.a", {}, T0)
    waiting = new_message("mail.a", {}, T0 + dt.timedelta(minutes=1))
    async with store.begin() as tx:
        await store.add(tx, doomed, waiting)
    await store.bury(doomed.id, "550", at=T0)

    await backlog.refresh()

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(name, {"topic": "mail.a"})

    assert gauge("outbox_buried_messages") == 1
    assert gauge("outbox_pending_messages") == 1
    assert gauge("outbox_oldest_pending_age_seconds") == 240

    await store.ack_many([waiting.id])
    await store.purge_buried(dt.timedelta(0), now=now + dt.timedelta(seconds=1))
    await backlog.refresh()

    assert gauge("outbox_buried_messages") == 0
    assert gauge("outbox_pending_messages") == 0
    assert gauge("outbox_oldest_pending_age_seconds") == 0


async def test_a_running_relay_keeps_the_backlog_gauges_by_itself(store: Store[Any]) -> None:
    registry = CollectorRegistry()
    waiting = new_message("mail.b", {}, T0, deliver_at=T0 + dt.timedelta(hours=1))
    async with store.begin() as tx:
        await store.add(tx, waiting)
    relay = Relay(store, {"mail.b": _never}, registry=registry, clock=lambda: T0)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            while registry.get_sample_value("outbox_pending_messages", {"topic": "mail.b"}) != 1:  # noqa: ASYNC110 - a gauge has no event
                await anyio.sleep(0.01)
            relay.stop()


async def _never(m: Message) -> None:
    raise AssertionError("not due")


async def test_blocked_keys_are_counted_with_the_oldest_blocks_age(store: Store[Any]) -> None:
    registry = CollectorRegistry()
    now = T0 + dt.timedelta(minutes=7)
    head, behind = (new_message("orders.events", {"n": n}, T0, key="order-1") for n in (0, 1))
    async with store.begin() as tx:
        await store.add(tx, head, behind)
    [claimed] = await store.claim(T0, dt.timedelta(minutes=1), 10)  # parks what waits
    await store.bury_many([(claimed, "poison")], now=T0)

    await Backlog(store, clock=lambda: now, registry=registry).refresh()

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(name, {"topic": "orders.events"})

    assert gauge("outbox_blocked_keys") == 1
    assert gauge("outbox_oldest_blocked_key_age_seconds") == 420


async def test_the_count_says_how_many_a_lease_holds(store: Store[Any]) -> None:
    msgs = [new_message("mail.c", {"n": n}, T0) for n in range(3)]
    async with store.begin() as tx:
        await store.add(tx, *msgs)
    await store.claim(T0, dt.timedelta(minutes=1), 2)

    [stats] = await store.topic_stats()

    assert (stats.pending, stats.in_flight) == (3, 2)
