"""OutboxTopic resources drive the registry; status tells SREs how it went."""

from __future__ import annotations

import datetime as dt
import functools
from contextlib import AsyncExitStack
from pathlib import Path

import kmock
import nats
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, new_message
from outbox.handlers import HandlerKinds
from outbox.handlers.mail import LOGIN_LINK
from outbox.postgres import PostgresStore, migrate
from outbox.service.settings import NatsSettings, WebhookSettings
from tests.controller.conftest import Cluster, eventually, operator
from tests.integration.hooks import Receiver, serving
from tests.integration.test_nats import NatsServer


async def entry(cluster: Cluster, topic: str) -> object:
    return (await cluster.store.topics()).get(topic)


async def test_create_edit_delete_drive_the_registry(cluster: Cluster) -> None:
    await cluster.create("mail-login-link", topic=LOGIN_LINK, enabled=True)

    await eventually("the entry", lambda: _has(cluster, LOGIN_LINK))
    await eventually(
        "Ready", lambda: (cluster.condition("mail-login-link") or {}).get("status") == "True"
    )
    status = cluster.obj("mail-login-link")["status"]
    assert status["observedGeneration"] == 1
    assert (status["topic"], status["handler"], status["enabled"]) == (LOGIN_LINK, "built-in", True)
    topics = await cluster.store.topics()
    assert topics[LOGIN_LINK].source == "kubernetes:ns1/mail-login-link"

    await cluster.edit(
        "mail-login-link", enabled=False, maxAttempts=3, timeout="10s", maxInFlight=4
    )
    await eventually("the pause", lambda: _enabled(cluster, LOGIN_LINK, False))
    topics = await cluster.store.topics()
    got = topics[LOGIN_LINK]
    assert (got.max_attempts, got.timeout, got.max_in_flight) == (3, dt.timedelta(seconds=10), 4)
    await eventually(
        "observedGeneration 2",
        lambda: cluster.obj("mail-login-link")["status"]["observedGeneration"] == 2,
    )

    await cluster.delete("mail-login-link")
    await eventually("the entry to go", lambda: _lacks(cluster, LOGIN_LINK))
    await eventually("the finalizer to be released", lambda: cluster.gone("mail-login-link"))


async def test_events_record_each_applied_change(cluster: Cluster) -> None:
    await cluster.create("orders", topic="orders.placed", handler="log")

    def posted() -> bool:
        events = [r for r in cluster.k8s if r.url.path.endswith("/events") and r.data]
        return any("registry updated: orders.placed: enabled" in str(r.data) for r in events)

    await eventually("an Applied event", posted)


async def test_second_resource_for_a_topic_reports_a_conflict(cluster: Cluster) -> None:
    await cluster.create("first", topic="orders.placed", handler="log")
    await eventually("the first to hold the topic", lambda: _has(cluster, "orders.placed"))
    await cluster.create("second", topic="orders.placed", handler="log", enabled=False)

    await eventually("a Conflict", lambda: cluster.condition("second", "Conflict") is not None)
    conflict = cluster.condition("second", "Conflict") or {}
    assert "governed by OutboxTopic ns1/first" in conflict["message"]
    assert (cluster.condition("second") or {})["status"] == "False"
    assert (await cluster.store.topics())["orders.placed"].enabled  # the first one's spec

    await cluster.delete("first")
    await eventually(
        "the second to take over", lambda: _enabled(cluster, "orders.placed", False), within=15
    )


async def test_invalid_specs_are_refused_with_a_condition(cluster: Cluster) -> None:
    await cluster.create("slow", topic=LOGIN_LINK, timeout="5m")
    await cluster.create("nameless", topic="orders.placed")
    await cluster.create("odd", topic="orders.shipped", handler="carrier-pigeon")

    for name, words in (
        ("slow", "does not stay below the relays' lease (2m)"),
        ("nameless", "has no built-in handler"),
        ("odd", "'carrier-pigeon' is unknown"),
    ):
        await eventually(
            f"{name} Invalid", functools.partial(_has_condition, cluster, name, "Invalid")
        )
        assert words in (cluster.condition(name, "Invalid") or {})["message"]
    assert await cluster.store.topics() == {}


async def test_status_shows_the_backlog(cluster: Cluster) -> None:
    now = dt.datetime.now(dt.UTC)
    waiting = new_message("orders.placed", {}, now - dt.timedelta(minutes=3))
    async with cluster.store.begin() as tx:
        await cluster.store.add(tx, waiting, new_message("orders.placed", {}, now))

    await cluster.create("orders", topic="orders.placed", handler="log", enabled=False)

    def counted() -> bool:
        status = cluster.obj("orders").get("status", {})
        return bool(status.get("pending") == 2 and status.get("oldestPendingSeconds", 0) >= 180)

    await eventually("the backlog in status", counted)
    assert cluster.obj("orders")["status"]["buried"] == 0
    assert cluster.obj("orders")["status"]["relays"] == 0


async def test_status_shows_the_blocked_keys_the_relays_measured(cluster: Cluster) -> None:
    store = cluster.store
    async with store.begin() as tx:
        await store.add(
            tx, *(new_message("orders.placed", {"n": n}, key="order-1") for n in range(3))
        )
    [head] = await store.claim(None, dt.timedelta(minutes=1), 10)  # parks the two behind it
    await store.bury_many([(head, "550 no such user")])
    await cluster.create("orders", topic="orders.placed", handler="log", enabled=False)

    async def shown() -> bool:
        # A relay's measurement, kept for the fleet, as its backlog gauges take it.
        await store.topic_stats(max_age=dt.timedelta(milliseconds=1))
        return bool(cluster.obj("orders").get("status", {}).get("blockedKeys") == 1)

    await eventually("blockedKeys in status", shown)
    assert cluster.obj("orders")["status"]["buried"] == 1


async def test_status_counts_the_live_relays_that_serve_the_topic(cluster: Cluster) -> None:
    relays = [
        Relay(
            cluster.store,
            {},
            RelayConfig.model_validate({}),
            registry=CollectorRegistry(),
            kinds=HandlerKinds().mapping,
        )
        for _ in range(2)
    ]
    await cluster.create("orders", topic="orders.placed", handler="log")
    await eventually("the entry", lambda: _has(cluster, "orders.placed"))
    for relay in relays:
        await relay.housekeep(force=True)  # reads the registry, then registers

    def served_by_two() -> bool:
        return bool(cluster.obj("orders").get("status", {}).get("relays") == 2)

    await eventually("two relays in status", served_by_two)
    await relays[0].fleet.leave()
    await eventually(
        "one relay in status", lambda: cluster.obj("orders")["status"].get("relays") == 1
    )


async def test_relay_honours_pause_within_a_poll_and_resumes(cluster: Cluster) -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    delivered: list[Message] = []

    async def handle(m: Message) -> None:
        delivered.append(m)

    relay = Relay(
        cluster.store,
        {LOGIN_LINK: handle},
        RelayConfig.model_validate({"interval": "1s"}),
        clock=lambda: now,
        registry=CollectorRegistry(),
    )
    await cluster.create("mail-login-link", topic=LOGIN_LINK, enabled=False)
    await eventually("the pause", lambda: _enabled(cluster, LOGIN_LINK, False))
    async with cluster.store.begin() as tx:
        await cluster.store.add(tx, new_message(LOGIN_LINK, {}, now))

    assert await relay.drain() == 0

    await cluster.edit("mail-login-link", enabled=True)
    await eventually("the resume", lambda: _enabled(cluster, LOGIN_LINK, True))
    now += dt.timedelta(seconds=1)  # one interval: the relay reads the registry again
    assert await relay.drain() == 1
    assert len(delivered) == 1


async def _has(cluster: Cluster, topic: str) -> bool:
    return topic in await cluster.store.topics()


async def _lacks(cluster: Cluster, topic: str) -> bool:
    return topic not in await cluster.store.topics()


async def _enabled(cluster: Cluster, topic: str, enabled: bool) -> bool:
    found = (await cluster.store.topics()).get(topic)
    return found is not None and found.enabled is enabled


async def test_max_attempts_from_the_resource_decides_when_a_message_is_buried(
    cluster: Cluster,
) -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    async def refuse(m: Message) -> None:
        raise ConnectionError("smtp down")

    relay = Relay(
        cluster.store,
        {LOGIN_LINK: refuse},
        RelayConfig.model_validate({"interval": "1s", "max_attempts": 8}),
        clock=lambda: now,
        registry=CollectorRegistry(),
    )
    await cluster.create("mail-login-link", topic=LOGIN_LINK, maxAttempts=2)
    await eventually("the override", lambda: _max_attempts(cluster, LOGIN_LINK, 2))
    m = new_message(LOGIN_LINK, {}, now)
    async with cluster.store.begin() as tx:
        await cluster.store.add(tx, m)

    for _ in range(2):
        await relay.drain()
        now += dt.timedelta(minutes=1)

    state = await cluster.store.get(m.id)
    assert state.buried_at is not None
    assert state.message.attempts == 2


async def _max_attempts(cluster: Cluster, topic: str, value: int) -> bool:
    found = (await cluster.store.topics()).get(topic)
    return found is not None and found.max_attempts == value


async def test_topics_bound_to_webhook_and_nats_deliver_without_a_relay_restart(
    k8s: kmock.KubernetesEmulator, pg_store: PostgresStore, pg_conninfo: str, tmp_path: Path
) -> None:
    stack = AsyncExitStack()
    receiver = await stack.enter_async_context(serving(Receiver()))
    url = receiver.url
    server = NatsServer(tmp_path / "js")
    server.start()
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await js.add_stream(name="SHIPPING", subjects=["shipping.>"])
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    allow = WebhookSettings(allow=url)
    kinds = HandlerKinds(
        clock=lambda: now, nats=NatsSettings.model_validate({"url": server.url}), webhook=allow
    )
    await migrate(pg_conninfo)
    await stack.enter_async_context(operator(k8s, pg_conninfo, kinds=kinds.mapping))
    cluster = Cluster(k8s, pg_store)
    relay = Relay(
        cluster.store,
        {},
        RelayConfig.model_validate({"interval": "1s"}),
        clock=lambda: now,
        registry=CollectorRegistry(),
        kinds=kinds.mapping,
    )
    try:
        await relay.drain()  # the relay runs before the topics exist
        await cluster.create(
            "orders-webhook",
            topic="orders.placed",
            handler="webhook",
            webhook={"url": url, "headers": {"X-Team": "billing"}},
        )
        await cluster.create(
            "orders-nats",
            topic="orders.shipped",
            handler="nats",
            nats={"subject": "shipping.orders"},
        )
        await eventually("both bindings", lambda: _count(cluster, 2))
        topics = await cluster.store.topics()
        assert dict(topics["orders.placed"].config) == {
            "url": url,
            "headers": {"X-Team": "billing"},
        }
        assert dict(topics["orders.shipped"].config) == {"subject": "shipping.orders"}
        async with cluster.store.begin() as tx:
            await cluster.store.add(
                tx,
                new_message("orders.placed", {"n": 1}, now),
                new_message("orders.shipped", {"n": 2}, now),
            )
        now += dt.timedelta(seconds=1)

        assert await relay.drain() == 2

        assert len(receiver.requests) == 1
        assert (await js.stream_info("SHIPPING")).state.messages == 1
    finally:
        await kinds.aclose()
        await nc.close()
        server.stop()
        await stack.aclose()


async def test_webhook_without_a_url_is_invalid(cluster: Cluster) -> None:
    await cluster.create("hook", topic="orders.placed", handler="webhook", webhook={})
    await cluster.create("legacy", topic="orders.shipped", handler="webhook", config={})
    await cluster.create("mixed", topic="orders.held", handler="log", nats={"subject": "a"})

    for name, words in (("hook", "url"), ("legacy", "url"), ("mixed", "spec.nats goes with")):
        await eventually(
            f"{name} Invalid", functools.partial(_has_condition, cluster, name, "Invalid")
        )
        assert words in (cluster.condition(name, "Invalid") or {})["message"]


async def _count(cluster: Cluster, n: int) -> bool:
    return len(await cluster.store.topics()) == n


def _has_condition(cluster: Cluster, name: str, condition: str) -> bool:
    return cluster.condition(name, condition) is not None
