"""A relay over a MemoryStore whose topic is bound to a generic handler kind."""

from __future__ import annotations

import datetime as dt
from typing import Any

from outbox import Message, Store
from outbox.handlers import HandlerKinds
from outbox.service.settings import AmqpSettings, NatsSettings, RedisSettings, WebhookSettings
from outbox.store import TopicSettings
from outbox.tracing import DeliveryTracer
from tests.relay import Harness

T0 = dt.datetime(2026, 3, 1, 8, 0, tzinfo=dt.UTC)
TOPIC = "orders.placed"


class KindRelay(Harness):
    """A relay with the handler kinds, its clock at ``now`` (T0 here); TOPIC bound by bind()."""

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
        self.payload = payload
        self.kinds = HandlerKinds(
            clock=lambda: self.now, nats=nats, webhook=webhook, amqp=amqp, redis=redis
        )
        super().__init__(
            store,
            kinds=self.kinds.mapping,
            tracer=tracer,
            **{"timeout": "2s", "lease": "1m", **config},
        )
        self.now = T0

    async def bind_kind(self, handler: str, config: dict[str, Any]) -> None:
        await self.store.set_topic(TopicSettings(TOPIC, handler=handler, config=config), self.now)

    async def add(self, headers: dict[str, str] | None = None) -> Message:
        return await self.add_one(TOPIC, self.payload, headers=headers)
