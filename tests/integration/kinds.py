"""A relay over a MemoryStore whose topic is bound to a generic handler kind."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, Store, new_message
from outbox.handlers import HandlerKinds
from outbox.service.settings import AmqpSettings, NatsSettings, RedisSettings, WebhookSettings
from outbox.store import TopicSettings
from outbox.tracing import DeliveryTracer

T0 = dt.datetime(2026, 3, 1, 8, 0, tzinfo=dt.UTC)
TOPIC = "orders.placed"


class KindRelay:
    """A relay with the handler kinds, its clock at ``now``; TOPIC bound by bind()."""

    def __init__(
        self,
        store: Store[Any],
        payload: dict[str, Any],
        *,
        nats: NatsSettings | None = None,
        webhook: WebhookSettings | None = None,
        amqp: AmqpSettings | None = None,
        redis: RedisSettings | None = None,
        tracer: DeliveryTracer | None = None,
        **config: Any,
    ) -> None:
        self.store = store
        self.payload = payload
        self.now = T0
        self.registry = CollectorRegistry()
        self.kinds = HandlerKinds(
            clock=lambda: self.now, nats=nats, webhook=webhook, amqp=amqp, redis=redis
        )
        self.relay = Relay(
            store,
            {},
            RelayConfig.model_validate({"timeout": "2s", "lease": "1m", **config}),
            clock=lambda: self.now,
            registry=self.registry,
            kinds=self.kinds.mapping,
            tracer=tracer,
        )

    async def bind_kind(self, handler: str, config: dict[str, Any]) -> None:
        await self.store.set_topic(TopicSettings(TOPIC, handler=handler, config=config), self.now)

    async def add(self, headers: dict[str, str] | None = None) -> Message:
        m = new_message(TOPIC, self.payload, self.now, headers=headers)
        async with self.store.begin() as tx:
            await self.store.add(tx, m)
        return m
