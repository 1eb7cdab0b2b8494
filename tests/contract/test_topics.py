"""The topic registry and how the relay follows it, on every backend."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import anyio
import pytest

from outbox import Message, NotFound, Store, backoff, new_message
from outbox.handlers import HandlerKinds
from outbox.requests import ClaimRequest
from outbox.store import TopicSettings
from tests.clock import T0
from tests.relay import Harness

SECOND = dt.timedelta(seconds=1)


async def test_registry_round_trip(store: Store[Any]) -> None:
    entry = TopicSettings(
        "mail.login_link",
        enabled=False,
        handler="log",
        config={"a": [1, "b"]},
        max_attempts=3,
        timeout=dt.timedelta(seconds=5),
        max_in_flight=4,
        source="cli",
        reroute=True,
    )

    await store.set_topic(entry, T0)
    await store.set_topic(TopicSettings("orders.placed"), T0)

    topics = await store.topics()
    assert topics["mail.login_link"] == dataclasses.replace(entry, updated_at=T0)
    assert topics["orders.placed"].enabled
    assert await store.delete_topic("orders.placed")
    assert not await store.delete_topic("orders.placed")
    assert set(await store.topics()) == {"mail.login_link"}


async def test_claim_takes_only_the_topics_asked_for(store: Store[Any]) -> None:
    paused, live = new_message("a.paused", {}, T0), new_message("b.live", {}, T0)
    async with store.begin() as tx:
        await store.add(tx, paused, live)

    claimed = (
        await store.claim_many(
            ClaimRequest(now=T0, lease=dt.timedelta(minutes=1), limit=10, topics=["b.live"])
        )
    ).messages

    assert [m.id for m in claimed] == [live.id]
    assert (
        await store.claim_many(
            ClaimRequest(now=T0, lease=dt.timedelta(minutes=1), limit=10, topics=[])
        )
    ).messages == []


class Fixture(Harness):
    def __init__(self, store: Store[Any], **config: Any) -> None:
        self.seen: list[tuple[str, int]] = []
        self.fail = False
        self.hang = False
        super().__init__(
            store,
            {"mail.login_link": self.handle},
            kinds=HandlerKinds().mapping,
            **{"interval": "1s", **config},
        )

    async def handle(self, m: Message) -> None:
        self.seen.append((m.topic, m.attempts))
        if self.hang:
            await anyio.sleep_forever()
        if self.fail:
            raise RuntimeError("down")

    async def add(self, topic: str = "mail.login_link") -> Message:
        return await self.add_one(topic, {})

    async def set(self, **fields: Any) -> None:
        await self.store.set_topic(TopicSettings(**fields), self.now)

    async def next_poll(self) -> int:
        """Drain after one interval has passed, as the registry cache allows."""
        self.now += SECOND
        return await self.relay.drain()


@pytest.fixture
def f(store: Store[Any]) -> Fixture:
    return Fixture(store)


async def test_paused_topic_stays_pending_and_resumes(f: Fixture) -> None:
    await f.set(topic="mail.login_link", enabled=False)
    m = await f.add()

    assert await f.next_poll() == 0
    state = await f.store.get(m.id)
    assert (state.buried_at, state.message.attempts) == (None, 0)

    await f.set(topic="mail.login_link", enabled=True)
    assert await f.next_poll() == 1
    assert f.seen == [("mail.login_link", 1)]


async def test_pause_applies_within_one_interval(f: Fixture) -> None:
    await f.relay.drain()  # reads the (empty) registry
    await f.set(topic="mail.login_link", enabled=False)
    await f.add()

    f.now += SECOND - dt.timedelta(milliseconds=1)
    assert await f.relay.drain() == 1  # the cached registry is at most one interval old

    await f.add()
    assert await f.next_poll() == 0


async def test_max_attempts_override_changes_when_a_message_is_buried(f: Fixture) -> None:
    await f.set(topic="mail.login_link", max_attempts=2)
    f.fail = True
    m = await f.add()

    await f.next_poll()
    f.now += backoff(1)
    await f.next_poll()

    state = await f.store.get(m.id)
    assert state.buried_at is not None
    assert state.last_error == "RuntimeError: down (after 2 attempts)"


async def test_timeout_override_bounds_the_handler(store: Store[Any]) -> None:
    f = Fixture(store, timeout="30s")
    await f.set(topic="mail.login_link", timeout=dt.timedelta(milliseconds=50))

    f.hang = True
    m = await f.add()
    other = await f.add("orders.placed")
    await f.set(topic="orders.placed", handler="log")

    await f.next_poll()

    assert (await store.get(m.id)).last_error == "timed out after 50ms"
    with pytest.raises(NotFound):
        await store.get(other.id)


async def test_generic_kind_delivers_a_new_topic_and_unknown_kind_leaves_it(f: Fixture) -> None:
    logged = await f.add("orders.placed")
    unknown = await f.add("orders.shipped")
    await f.set(topic="orders.placed", handler="log")
    await f.set(topic="orders.shipped", handler="carrier-pigeon")

    assert await f.next_poll() == 1

    assert f.registry.get_sample_value("outbox_delivered_total", {"topic": "orders.placed"}) == 1
    with pytest.raises(NotFound):
        await f.store.get(logged.id)
    state = await f.store.get(unknown.id)
    assert (state.buried_at, state.message.attempts) == (None, 0)


@pytest.mark.parametrize(
    "source", ["kubernetes:tenant-b/steal", "kubernetes:outbox/mail-login-link", None]
)
async def test_an_entry_without_a_reroute_grant_never_replaces_the_relays_own_handler(
    f: Fixture, source: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    # Applied while no relay served the topic (a fresh install, an outage):
    # the relay that then starts with its own handler keeps it.
    await f.set(topic="mail.login_link", handler="log", source=source, max_attempts=2)
    code = await f.add()
    await f.add()

    assert await f.next_poll() == 2

    assert f.seen == [("mail.login_link", 1), ("mail.login_link", 1)]
    with pytest.raises(NotFound):
        await f.store.get(code.id)
    said = [r.getMessage() for r in caplog.records if "without a reroute grant" in r.getMessage()]
    assert said == [  # once, however many messages and polls
        f"topic mail.login_link: the entry of {source or 'unknown source'} sends it to handler "
        "'log' without a reroute grant; this relay keeps its own handler"
    ]
    await f.set(topic="mail.login_link", handler="log", source=source, enabled=False)
    await f.add()
    assert await f.next_poll() == 0, "what else the entry says still applies"


async def test_an_entry_with_a_reroute_grant_sends_the_topic_to_its_kind(f: Fixture) -> None:
    await f.set(topic="mail.login_link", handler="log", source="cli", reroute=True)
    await f.add()

    assert await f.next_poll() == 1

    assert f.seen == []
    assert f.metric("outbox_delivered_total", "mail.login_link") == 1


async def test_a_relay_registers_the_topics_it_has_a_handler_of_its_own_for(f: Fixture) -> None:
    await f.set(topic="orders.placed", handler="log")
    await f.relay.drain()

    [me] = await f.store.relays(now=f.now)

    assert set(me.topics) == {"mail.login_link", "orders.placed"}
    assert me.handlers == ("mail.login_link",)


async def test_topic_without_entry_or_builtin_waits_the_grace_and_builtin_uses_defaults(
    f: Fixture,
) -> None:
    stray = await f.add("billing.invoice")
    await f.add("mail.login_link")

    await f.next_poll()
    assert (await f.store.get(stray.id)).buried_at is None
    f.now += f.relay.config.unserved_grace
    await f.next_poll()

    assert (await f.store.get(stray.id)).last_error == (
        "no handler for topic billing.invoice (no live relay served it for 10m)"
    )
    assert f.seen == [("mail.login_link", 1)]


async def test_timeout_at_or_above_the_lease_is_ignored(f: Fixture) -> None:
    await f.set(topic="mail.login_link", timeout=dt.timedelta(minutes=5))

    await f.next_poll()

    route = f.relay.router.route("mail.login_link")
    assert route is not None
    assert route.timeout == f.relay.config.timeout


async def test_the_oldest_resource_governs_a_topic_whatever_the_order(store: Store[Any]) -> None:
    hour = dt.timedelta(hours=1)

    def resource(name: str, created: dt.datetime | None, **fields: Any) -> TopicSettings:
        return TopicSettings(
            "orders.placed", source=f"kubernetes:ns/{name}", owner_since=created, **fields
        )

    newer = resource("newer", T0, handler="log")
    older = resource("older", T0 - hour, handler="log", enabled=False)

    assert await store.govern_topic(newer, T0) == "kubernetes:ns/newer"  # first come
    assert await store.govern_topic(older, T0) == "kubernetes:ns/older"  # older wins
    assert await store.govern_topic(newer, T0) == "kubernetes:ns/older"  # and keeps it
    assert not (await store.topics())["orders.placed"].enabled
    same_age = resource("aaa", T0 - hour)
    assert await store.govern_topic(same_age, T0) == "kubernetes:ns/aaa"  # then by name
    await store.set_topic(TopicSettings("orders.shipped", source="cli"), T0)
    taker = dataclasses.replace(newer, topic="orders.shipped")
    # An operator's entry never yields: the resource reports a Conflict instead.
    assert await store.govern_topic(taker, T0) == "cli"
    assert (await store.topics())["orders.shipped"].source == "cli"


@pytest.mark.postgres_only
async def test_racing_resources_agree_on_the_older_holder(pg_store: Any) -> None:
    hour = dt.timedelta(hours=1)
    racers = [
        TopicSettings("orders.placed", source=f"kubernetes:ns/r{i}", owner_since=T0 - i * hour)
        for i in range(8)
    ]
    holders: list[str | None] = []

    async def govern(entry: TopicSettings) -> None:
        holders.append(await pg_store.govern_topic(entry, T0))

    async with anyio.create_task_group() as tg:
        for entry in racers:
            tg.start_soon(govern, entry)

    assert None not in holders
    assert (await pg_store.topics())["orders.placed"].source == "kubernetes:ns/r7"
