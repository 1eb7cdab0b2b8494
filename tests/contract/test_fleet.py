"""Several relays on one store: registration, fleet-aware routing and stale write-backs.

Every relay here is a real Relay over the same store, driven by one injected
clock that the tests move; a relay "stalls" by being left behind in a
handler while the clock runs past its lease and another relay takes over.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from outbox import (
    Message,
    NotFound,
    Permanent,
    Relay,
    RelayConfig,
    Store,
    Unavailable,
    new_message,
)
from outbox.handlers import KINDS, HandlerKinds
from outbox.store import RelayInfo, TopicSettings
from tests.clock import T0

TTL = dt.timedelta(seconds=30)
GRACE = dt.timedelta(minutes=10)


class Fleet:
    """Relays sharing ``store`` and one clock, ``self.now``."""

    def __init__(self, store: Store[Any]) -> None:
        self.store = store
        self.now = T0
        self.registries: dict[int, CollectorRegistry] = {}

    def relay(
        self, topics: dict[str, Callable[[Message], Awaitable[None]]], **config: Any
    ) -> Relay:
        registry = CollectorRegistry()
        relay = Relay(
            self.store,
            topics,
            RelayConfig.model_validate({"lease": "2m", **config}),
            clock=lambda: self.now,
            registry=registry,
            kinds=HandlerKinds().mapping,
        )
        self.registries[id(relay)] = registry
        return relay

    def metric(self, relay: Relay, name: str, topic: str) -> float:
        value = self.registries[id(relay)].get_sample_value(name, {"topic": topic})
        return value or 0.0

    async def add(self, topic: str = "orders.placed", **payload: Any) -> Message:
        m = new_message(topic, payload, self.now)
        async with self.store.begin() as tx:
            await self.store.add(tx, m)
        return m


@pytest.fixture
def fleet(store: Store[Any]) -> Fleet:
    return Fleet(store)


def info(topics: tuple[str, ...] = ("orders.placed",)) -> RelayInfo:
    return RelayInfo(uuid.uuid4(), "pod-a", 7, "1.0", topics, ("log",))


async def nothing(m: Message) -> None:
    return None


# -- the store's fleet methods -------------------------------------------------


async def test_registered_relays_are_live_until_their_row_expires(store: Store[Any]) -> None:
    a, b = info(), info(("mail.login_link",))
    assert await store.register_relay(a, TTL, now=T0) == T0
    await store.register_relay(b, TTL, now=T0 + dt.timedelta(seconds=10))

    live = await store.relays(now=T0 + dt.timedelta(seconds=20))
    assert [(r.id, r.topics, r.host, r.pid) for r in live] == [
        (a.id, ("orders.placed",), "pod-a", 7),
        (b.id, ("mail.login_link",), "pod-a", 7),
    ]
    assert [r.id for r in await store.relays(now=T0 + TTL)] == [b.id]  # a stalled

    await store.register_relay(a, TTL, now=T0 + TTL)  # a is back
    await store.unregister_relay(b.id)  # b exits cleanly
    [back] = await store.relays(now=T0 + TTL)
    assert (back.id, back.started_at, back.seen_at) == (a.id, T0, T0 + TTL)


async def test_unserved_topic_is_buried_only_after_the_grace(store: Store[Any]) -> None:
    stray = new_message("billing.invoice", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, stray)

    assert await store.bury_unserved(GRACE, now=T0) == {}  # noted
    assert await store.bury_unserved(GRACE, now=T0 + GRACE - dt.timedelta(seconds=1)) == {}
    buried = await store.bury_unserved(GRACE, now=T0 + GRACE)

    assert buried == {"billing.invoice": 1}
    state = await store.get(stray.id)
    assert state.buried_at == T0 + GRACE
    assert state.last_error == (
        "no handler for topic billing.invoice (no live relay served it for 10m)"
    )


async def test_a_live_relay_or_a_registry_entry_keeps_a_topic_waiting(store: Store[Any]) -> None:
    served, governed = new_message("orders.placed", {}, T0), new_message("orders.held", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, served, governed)
    await store.set_topic(TopicSettings("orders.held", enabled=False), T0)
    relay = info(("orders.placed",))

    for minutes in (0, 10, 20):
        now = T0 + dt.timedelta(minutes=minutes)
        await store.register_relay(relay, TTL, now=now)
        assert await store.bury_unserved(GRACE, now=now) == {}


async def test_a_topic_served_again_starts_its_grace_afresh(store: Store[Any]) -> None:
    m = new_message("orders.placed", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, m)
    await store.bury_unserved(GRACE, now=T0)  # unserved since T0
    relay = info()
    await store.register_relay(relay, TTL, now=T0 + dt.timedelta(minutes=5))
    await store.bury_unserved(GRACE, now=T0 + dt.timedelta(minutes=5))  # served: forgotten
    await store.unregister_relay(relay.id)

    assert await store.bury_unserved(GRACE, now=T0 + dt.timedelta(minutes=6)) == {}
    assert await store.bury_unserved(GRACE, now=T0 + dt.timedelta(minutes=15)) == {}
    assert await store.bury_unserved(GRACE, now=T0 + dt.timedelta(minutes=16)) == {
        "orders.placed": 1
    }


async def test_the_sweep_buries_in_batches_within_a_budget_and_counts_by_topic(
    store: Store[Any],
) -> None:
    async with store.begin() as tx:
        await store.add(tx, *(new_message("billing.invoice", {"n": n}, T0) for n in range(7)))
        await store.add(tx, *(new_message("orders.plcaed", {"n": n}, T0) for n in range(3)))
    await store.bury_unserved(GRACE, now=T0)
    later = T0 + GRACE

    first = await store.bury_unserved(GRACE, now=later, batch=2, budget=5)
    second = await store.bury_unserved(GRACE, now=later, batch=2, budget=5)

    assert first == {"billing.invoice": 5}
    assert second == {"billing.invoice": 2, "orders.plcaed": 3}
    assert await store.bury_unserved(GRACE, now=later, batch=2, budget=5) == {}
    assert len(await store.list_buried(limit=100)) == 10


async def test_a_relay_that_starts_serving_a_topic_stops_its_sweep(store: Store[Any]) -> None:
    async with store.begin() as tx:
        await store.add(tx, *(new_message("orders.placed", {"n": n}, T0) for n in range(4)))
    await store.bury_unserved(GRACE, now=T0)
    await store.register_relay(info(("orders.placed",)), TTL, now=T0 + GRACE)

    assert await store.bury_unserved(GRACE, now=T0 + GRACE, batch=2) == {}


# -- relays with different handlers (rolling deploys) -------------------------


async def test_a_relay_claims_only_topics_it_can_deliver(fleet: Fleet) -> None:
    seen: list[str] = []

    async def record(m: Message) -> None:
        seen.append(m.topic)

    old = fleet.relay({"mail.login_link": record})
    new = fleet.relay({"mail.login_link": record, "orders.placed": record})
    m = await fleet.add("orders.placed")

    assert await old.drain() == 0
    state = await fleet.store.get(m.id)
    assert (state.message.attempts, state.buried_at) == (0, None)
    assert await new.drain() == 1
    assert seen == ["orders.placed"]


async def test_a_rolling_deploy_buries_nothing(fleet: Fleet) -> None:
    old = fleet.relay({"mail.login_link": nothing})
    m = await fleet.add("orders.placed")

    # The old version runs alone for most of the grace, polling all along.
    for _ in range(9):
        await old.drain()
        fleet.now += dt.timedelta(minutes=1)
    new = fleet.relay({"mail.login_link": nothing, "orders.placed": nothing})
    await new.housekeep()  # the new version comes up and registers
    for _ in range(20):
        fleet.now += dt.timedelta(minutes=1)
        await old.drain()
        await new.housekeep()

    state = await fleet.store.get(m.id)
    assert state.buried_at is None
    assert fleet.metric(old, "outbox_buried_total", "orders.placed") == 0
    assert await new.drain() == 1


async def test_deleting_a_topics_entry_buries_nothing_by_itself(fleet: Fleet) -> None:
    relay = fleet.relay({}, interval="1s")
    await fleet.store.set_topic(TopicSettings("orders.placed", enabled=False, handler="log"))
    m = await fleet.add("orders.placed")
    await relay.drain()

    assert await fleet.store.delete_topic("orders.placed")
    for _ in range(5):
        fleet.now += dt.timedelta(minutes=1)
        await relay.drain()
    assert (await fleet.store.get(m.id)).buried_at is None

    await fleet.store.set_topic(TopicSettings("orders.placed", handler="log"))
    fleet.now += dt.timedelta(seconds=1)
    assert await relay.drain() == 1
    with pytest.raises(NotFound):
        await fleet.store.get(m.id)


async def test_relays_list_what_they_serve(fleet: Fleet) -> None:
    await fleet.store.set_topic(TopicSettings("orders.placed", handler="webhook", config={}))
    await fleet.store.set_topic(TopicSettings("orders.logged", enabled=False, handler="log"))
    relay = fleet.relay({"mail.login_link": nothing})

    await relay.housekeep()

    [me] = await fleet.store.relays(now=fleet.now)
    assert me.id == relay.fleet.id
    # webhook refused its empty config: this relay cannot serve orders.placed
    assert me.topics == ("mail.login_link", "orders.logged")
    assert me.kinds == tuple(sorted(kind.name for kind in KINDS))
    assert me.expires_at == fleet.now + relay.fleet.ttl


# -- stale relays: their write-backs change nothing -------------------------------


class Stalled:
    """Relay A is inside its handler for M when the clock passes its lease and B claims M."""

    def __init__(self, fleet: Fleet, verdict: Callable[[Message], Awaitable[None]]) -> None:
        self.fleet = fleet
        self.entered, self.go = anyio.Event(), anyio.Event()
        self.verdict = verdict
        self.b_calls: list[Message] = []

        async def a_handler(m: Message) -> None:
            self.entered.set()
            await self.go.wait()
            await verdict(m)

        async def b_handler(m: Message) -> None:
            self.b_calls.append(m)

        self.a = fleet.relay({"orders.placed": a_handler}, timeout="1m", lease="2m")
        self.b = fleet.relay({"orders.placed": b_handler}, timeout="1m", lease="2m")

    async def run(self, b_finishes: bool) -> Message:
        m = await self.fleet.add("orders.placed")
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.a.poll)
            with anyio.fail_after(5):
                await self.entered.wait()
            self.fleet.now += dt.timedelta(minutes=2)  # A's lease ends; B claims M
            if b_finishes:
                assert await self.b.poll() == 1
            else:
                assert (
                    len(await self.fleet.store.claim(self.fleet.now, dt.timedelta(minutes=2), 1))
                    == 1
                )
            self.go.set()  # A wakes up and writes back
        return m


async def fail(m: Message) -> None:
    raise ConnectionError("smtp down")


async def permanent(m: Message) -> None:
    raise Permanent("550 no such mailbox")


async def unavailable(m: Message) -> None:
    raise Unavailable(dt.timedelta(seconds=5), "smtp: 535 authentication failed")


@pytest.mark.parametrize(
    "verdict", [fail, permanent, unavailable], ids=["retry", "bury", "unavailable"]
)
async def test_a_stale_relays_verdict_does_not_touch_the_new_holder(
    fleet: Fleet, verdict: Callable[[Message], Awaitable[None]]
) -> None:
    stalled = Stalled(fleet, verdict)

    m = await stalled.run(b_finishes=False)

    state = await fleet.store.get(m.id)
    assert state.buried_at is None
    assert state.last_error is None
    assert state.leased_until == fleet.now + dt.timedelta(minutes=2)  # still the new holder's
    assert state.message.attempts == 2  # A's uncounted retry gave back none of B's
    assert fleet.metric(stalled.a, "outbox_lease_lost_total", "orders.placed") == 1
    assert fleet.metric(stalled.a, "outbox_retried_total", "orders.placed") == 0
    assert fleet.metric(stalled.a, "outbox_buried_total", "orders.placed") == 0


async def test_a_late_verdict_after_delivery_elsewhere_is_harmless(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    stalled = Stalled(fleet, fail)

    m = await stalled.run(b_finishes=True)

    with pytest.raises(NotFound):
        await fleet.store.get(m.id)
    assert [c.id for c in stalled.b_calls] == [m.id]
    assert fleet.metric(stalled.a, "outbox_lease_lost_total", "orders.placed") == 1
    lost = [r for r in caplog.records if r.getMessage().startswith("lease lost")]
    assert len(lost) == 1
    assert str(m.id) in lost[0].getMessage()
    assert "topic=orders.placed" in lost[0].getMessage()


async def test_a_stale_release_on_stop_does_not_hand_back_the_new_holders_message(
    fleet: Fleet,
) -> None:
    entered = anyio.Event()

    async def hang(m: Message) -> None:
        entered.set()
        await anyio.sleep_forever()

    # The timeout must outlast the claim below (B takes the message while A's
    # handler still runs); A only hits it once stopping. A polls once: a poll of
    # its own after the clock moved would lock the orphan for a moment (to leave
    # it for a solo claim), and the claim below would skip it.
    a = fleet.relay({"orders.placed": hang}, timeout="1s", lease="2m", interval="1h")
    m = await fleet.add("orders.placed")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.run)
            await entered.wait()
            fleet.now += dt.timedelta(minutes=2)
            [taken] = await fleet.store.claim(fleet.now, dt.timedelta(minutes=2), 1)
            a.stop()  # A's handler hits its deadline while stopping: a release

    state = await fleet.store.get(m.id)
    assert taken.id == m.id
    assert state.leased_until == fleet.now + dt.timedelta(minutes=2)
    assert state.message.attempts == 2
    assert fleet.metric(a, "outbox_lease_lost_total", "orders.placed") == 1
