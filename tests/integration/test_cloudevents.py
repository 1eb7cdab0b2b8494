"""CloudEvents in binary mode, per topic, through the webhook, NATS and AMQP kinds,
read back with the CloudEvents SDK where it has the binding."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import aio_pika
import pytest
from cloudevents.v1.http import from_http

from outbox import new_message
from outbox.handlers.cloudevents import amqp_properties, attributes, ce_headers
from outbox.memory import MemoryStore
from tests.integration.hooks import SECRET, SECRET_ENV, Hooked, Receiver
from tests.integration.kinds import T0, TOPIC
from tests.tools import require_service


def keyed(at: dt.datetime) -> Any:
    return new_message(TOPIC, {"order": 42}, at, key="order-42")


async def test_a_webhook_topic_sends_a_binary_cloudevent(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hooked = Hooked(MemoryStore(), receiver.url)
    await hooked.bind(cloudEvents=True)
    m = keyed(hooked.now)
    async with hooked.store.begin() as tx:
        await hooked.store.add(tx, m)

    assert await hooked.relay.drain() == 1
    await hooked.kinds.aclose()

    [(headers, body)] = receiver.requests
    event = from_http(headers, body)
    assert event["specversion"] == "1.0"
    assert event["id"] == str(m.id)
    assert event["source"] == f"/outbox/topics/{TOPIC}"
    assert event["type"] == TOPIC
    assert event["subject"] == "order-42"
    assert event["time"] == "2026-03-01T08:00:00.000Z"
    assert event.data == {"order": 42}
    assert headers["Idempotency-Key"] == str(m.id)  # the relay's own headers stay


async def test_without_cloudevents_no_ce_header_is_sent(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hooked = Hooked(MemoryStore(), receiver.url)
    await hooked.bind()
    await hooked.add()

    assert await hooked.relay.drain() == 1
    await hooked.kinds.aclose()

    [(headers, _)] = receiver.requests
    assert not [name for name in headers if name.lower().startswith("ce-")]


async def test_an_amqp_topic_sends_the_amqp_bindings_properties() -> None:
    from tests.integration.test_amqp import URL, Publisher

    require_service("127.0.0.1", 5672, "RabbitMQ")
    connection = await aio_pika.connect_robust(URL)
    channel = await connection.channel()
    name = f"outbox-test-{uuid.uuid4().hex[:8]}"
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT)
    queue = await channel.declare_queue(name, exclusive=True)
    await queue.bind(exchange)
    try:
        p = Publisher(MemoryStore())
        await p.bind(name, cloudEvents=True)
        m = keyed(p.now)
        async with p.store.begin() as tx:
            await p.store.add(tx, m)
        assert await p.relay.drain() == 1
        await p.kinds.aclose()
        got = await queue.get(timeout=5)
        await got.ack()
    finally:
        await channel.exchange_delete(name)
        await connection.close()

    assert got.content_type == "application/json"
    assert json.loads(got.body) == {"order": 42}
    assert {k: v for k, v in (got.headers or {}).items() if k.startswith("cloudEvents:")} == {
        "cloudEvents:specversion": "1.0",
        "cloudEvents:id": str(m.id),
        "cloudEvents:source": f"/outbox/topics/{TOPIC}",
        "cloudEvents:type": TOPIC,
        "cloudEvents:time": "2026-03-01T08:00:00.000Z",
        "cloudEvents:subject": "order-42",
    }


def test_attributes_outside_printable_ascii_are_percent_encoded_over_http() -> None:
    m = new_message(TOPIC, {}, T0, key='zoë "1" 100%')

    assert attributes(m)["subject"] == 'zoë "1" 100%'
    assert ce_headers(m)["ce-subject"] == "zo%C3%AB%20%221%22%20100%25"
    assert amqp_properties(m)["cloudEvents:subject"] == 'zoë "1" 100%'
    assert "ce-subject" not in ce_headers(new_message(TOPIC, {}, T0))
