"""The amqp handler kind against the CI's RabbitMQ (127.0.0.1:5672, guest/guest)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import anyio
import pytest

from outbox import NotFound, Store, backoff, new_message
from outbox.errors import ConfigError
from outbox.handlers import HandlerKinds
from outbox.handlers.amqp import KIND, AmqpConfig
from outbox.memory import MemoryStore
from outbox.service.settings import AmqpSettings
from outbox.settings import load
from tests.integration.kinds import TOPIC, KindRelay
from tests.tools import require, require_root, require_service

URL = "amqp://127.0.0.1:5672/"


class Publisher(KindRelay):
    def __init__(self, store: Store[Any], **config: Any) -> None:
        settings = AmqpSettings.model_validate({"url": URL, "timeout": "3s"})
        super().__init__(store, {"order": 7}, amqp=settings, **config)

    async def bind(self, exchange: str, **extra: Any) -> None:
        await self.bind_kind("amqp", {"exchange": exchange, **extra})


class Broker:
    """An exchange of the test's own with one durable queue bound to ``binding``."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.name = f"outbox-test-{uuid.uuid4().hex[:8]}"
        self.queue: aio_pika.abc.AbstractQueue | None = None

    async def bind(self, binding: str) -> None:
        exchange = await self.channel.declare_exchange(
            self.name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self.queue = await self.channel.declare_queue(self.name, durable=True)
        await self.queue.bind(exchange, binding)

    async def received(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        assert self.queue is not None
        got = []
        while (m := await self.queue.get(fail=False)) is not None:
            await m.ack()
            got.append(m)
        return got


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    require_service("127.0.0.1", 5672, "RabbitMQ")
    connection = await aio_pika.connect_robust(URL, reconnect_interval=1)
    channel = await connection.channel()
    b = Broker(channel)
    await channel.declare_exchange(b.name, aio_pika.ExchangeType.TOPIC, durable=True)
    yield b
    with anyio.move_on_after(10):
        await channel.queue_delete(b.name)
        await channel.exchange_delete(b.name)
    await connection.close()


async def test_a_confirmed_publish_carries_id_headers_and_persistence(broker: Broker) -> None:
    await broker.bind("orders.#")
    p = Publisher(MemoryStore())
    await p.bind(broker.name)
    plain = await p.add(headers={"X-Tenant": "acme"})
    keyed = new_message(TOPIC, {"order": 8}, p.now, key="order-8")
    async with p.store.begin() as tx:
        await p.store.add(tx, keyed)

    assert await p.relay.drain() == 2
    await p.kinds.aclose()

    # the two are delivered concurrently, so they may reach the queue in either order
    got = {m.message_id: m for m in await broker.received()}
    assert got.keys() == {str(plain.id), str(keyed.id)}
    first, second = got[str(plain.id)], got[str(keyed.id)]
    assert first.body == b'{"order":7}'
    assert first.content_type == "application/json"
    assert first.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert first.routing_key == TOPIC
    assert first.headers == {"x-tenant": "acme", "outbox-topic": TOPIC, "outbox-attempt": 1}
    assert second.headers["outbox-key"] == "order-8"


async def test_the_ordering_key_can_be_the_routing_key(broker: Broker) -> None:
    await broker.bind("order-9")
    p = Publisher(MemoryStore())
    await p.bind(broker.name, routingKey="unused", orderingKey="routingKey")
    m = new_message(TOPIC, {"order": 9}, p.now, key="order-9")
    async with p.store.begin() as tx:
        await p.store.add(tx, m)

    assert await p.relay.drain() == 1
    await p.kinds.aclose()

    [got] = await broker.received()
    assert (got.message_id, got.routing_key) == (str(m.id), "order-9")
    assert "outbox-key" not in (got.headers or {})


async def test_an_unroutable_message_fails_with_its_reason_then_is_buried(
    broker: Broker,
) -> None:
    p = Publisher(MemoryStore(), max_attempts=2)
    await p.bind(broker.name, routingKey="nobody.listens")  # no queue bound at all
    m = await p.add()

    await p.relay.drain()
    first = await p.store.get(m.id)
    p.now += backoff(1)
    await p.relay.drain()
    await p.kinds.aclose()

    assert first.buried_at is None
    assert first.last_error == (
        f"LookupError: amqp: exchange {broker.name} routed nobody.listens to no queue "
        "(returned unroutable)"
    )
    state = await p.store.get(m.id)
    assert state.buried_at is not None


async def test_a_missing_exchange_is_a_clear_error_and_the_next_publish_still_works(
    broker: Broker,
) -> None:
    await broker.bind("#")
    p = Publisher(MemoryStore())
    await p.bind("outbox-test-no-such-exchange")
    lost = await p.add()
    await p.relay.drain()
    assert (await p.store.get(lost.id)).last_error == (
        "LookupError: amqp: exchange outbox-test-no-such-exchange does not exist"
    )

    await p.bind(broker.name)  # the operator fixes the topic
    await p.relay.refresh_topics()
    p.now += backoff(1)
    assert await p.relay.drain() == 1
    await p.kinds.aclose()
    assert [m.message_id for m in await broker.received()] == [str(lost.id)]


async def test_a_broker_restart_is_retried_and_nothing_is_lost(broker: Broker) -> None:
    ctl = require("rabbitmqctl", "rabbitmq-server")
    require_root("restarting RabbitMQ")
    await broker.bind("#")
    p = Publisher(MemoryStore(), max_attempts=1000)
    await p.bind(broker.name)
    await p.add()
    assert await p.relay.drain() == 1  # connected
    await broker.received()

    with anyio.fail_after(60):
        await anyio.run_process([ctl, "stop_app"])
    try:
        m = await p.add()
        await p.relay.drain()
        state = await p.store.get(m.id)
        assert state.last_error is not None  # a closed connection, or the timeout
        assert state.buried_at is None
    finally:
        with anyio.fail_after(120):
            await anyio.run_process([ctl, "start_app"])
    deadline = time.monotonic() + 60
    while await _stored(p.store, m.id):
        assert time.monotonic() < deadline, "not delivered within a minute of the restart"
        p.now += backoff(10)
        await p.relay.drain()
        await anyio.sleep(0.5)  # the broker and the robust connection come back in real time
    await p.kinds.aclose()

    assert await p.store.list_buried() == []
    assert [got.message_id for got in await _drained_queue(broker.name)] == [str(m.id)]


async def _stored(store: Store[Any], message_id: uuid.UUID) -> bool:
    try:
        await store.get(message_id)
    except NotFound:
        return False
    return True


async def _drained_queue(name: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The queue's messages, read on a connection of its own (the fixture's may be
    reconnecting after the restart)."""
    connection = await aio_pika.connect_robust(URL)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        got = []
        while (m := await queue.get(fail=False)) is not None:
            await m.ack()
            got.append(m)
        return got
    finally:
        await connection.close()


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({}, "exchange"),
        ({"exchange": "orders exchange"}, "exchange"),
        ({"exchange": "orders", "orderingKey": "body"}, "orderingKey"),
        ({"exchange": "orders", "routing_key": "x", "mandatory": False}, "mandatory"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        HandlerKinds().mapping["amqp"](config)


def test_the_allow_list_admits_named_exchanges_and_prefixes() -> None:
    kinds = HandlerKinds(amqp=AmqpSettings(allow="orders, billing.*"))
    for admitted in ("orders", "billing.eu"):
        kinds.mapping["amqp"]({"exchange": admitted})
    for refused in ("", "orders2", "amq.topic"):
        with pytest.raises(ValueError, match="not in OUTBOX_AMQP_ALLOW"):
            kinds.mapping["amqp"]({"exchange": refused})


def test_credentials_in_the_url_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_AMQP_URL", "amqp://relay:hunter2@rabbitmq:5672/")
    with pytest.raises(ConfigError, match="OUTBOX_AMQP_PASSWORD") as caught:
        load(AmqpSettings)
    assert "hunter2" not in str(caught.value)


def test_the_resource_and_the_cli_spell_the_config_alike() -> None:
    spec = {"exchange": "orders", "routingKey": "orders.placed", "orderingKey": "routingKey"}

    assert AmqpConfig.model_validate(KIND.config_of(spec)) == AmqpConfig.model_validate(spec)
