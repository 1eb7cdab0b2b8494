"""The amqp handler kind: publish each message to a RabbitMQ exchange, confirmed.

Every publish is ``mandatory`` on a channel in confirm mode: the message counts
as delivered only once the broker confirmed it (it reached at least one queue,
written to disk for a durable one). A message no queue is bound for comes back
(``basic.return``) and a nack is a failure, each with its reason, retried with
backoff and in the end buried. Each message goes out persistent, as
``application/json``, with ``message_id`` the outbox id (the same on every
attempt: consumers drop repeats by it), its headers, and ``outbox-topic``,
``outbox-attempt`` and, for a keyed message, ``outbox-key``; with
``orderingKey: routingKey`` the key is the routing key instead (for a
consistent-hash exchange, say).

One robust connection per relay reconnects by itself; publishes share a small
set of channels (OUTBOX_AMQP_CHANNELS), many in flight on each.
OUTBOX_AMQP_ALLOW narrows the exchanges topics may name.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from outbox.clock import Clock
from outbox.handler import Handler, Kind
from outbox.handlers.allow import check_name
from outbox.handlers.cloudevents import amqp_properties
from outbox.handlers.config import parse_config
from outbox.handlers.settings import AmqpSettings
from outbox.message import Message
from outbox.tracing import tracing, with_trace

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractRobustConnection

__all__ = ["KIND", "AmqpConfig", "AmqpKind"]


class AmqpConfig(BaseModel):
    """spec.amqp (or --config) of an amqp OutboxTopic."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    exchange: str = Field(pattern=r"^[A-Za-z0-9._:\-]*$", max_length=255)
    routing_key: str | None = Field(default=None, alias="routingKey", max_length=255)
    ordering_key: Literal["header", "routingKey"] = Field(default="header", alias="orderingKey")
    cloud_events: bool = Field(default=False, alias="cloudEvents")


class AmqpKind:
    """Builds amqp handlers; owns the relay's one connection and its channels (aclose())."""

    def __init__(self, settings: AmqpSettings) -> None:
        self.settings = settings
        self._connection: AbstractRobustConnection | None = None
        self._channels: list[AbstractChannel | None] = [None] * settings.channels
        self._turn = 0
        self._lock: anyio.Lock | None = None

    def __call__(self, config: Mapping[str, Any]) -> Handler:
        cfg = parse_config(AmqpConfig, config)
        check_name("exchange", cfg.exchange, self.settings.exchanges(), "OUTBOX_AMQP_ALLOW")
        try:
            import aio_pika
            import aiormq.exceptions
        except ImportError:
            raise ValueError("the amqp handler kind needs outbox-relay[amqp] installed") from None
        timeout = self.settings.timeout.total_seconds()
        where = f"exchange {cfg.exchange or '(default)'}"

        async def publish(m: Message) -> None:
            headers: dict[str, Any] = dict(with_trace(m.headers) if tracing() else m.headers)
            if cfg.cloud_events:
                headers.update(amqp_properties(m))
            headers["outbox-topic"] = m.topic
            headers["outbox-attempt"] = m.attempts
            routing_key = cfg.routing_key if cfg.routing_key is not None else m.topic
            if m.key is not None and cfg.ordering_key == "routingKey":
                routing_key = m.key
            elif m.key is not None:
                headers["outbox-key"] = m.key
            message = aio_pika.Message(
                m.payload,
                message_id=str(m.id),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                timestamp=m.created_at,
                headers=headers,
            )
            channel = await self._channel()
            try:
                exchange = (
                    await channel.get_exchange(cfg.exchange, ensure=False)
                    if cfg.exchange
                    else channel.default_exchange
                )
                await exchange.publish(
                    message, routing_key=routing_key, mandatory=True, timeout=timeout
                )
            except aiormq.exceptions.PublishError:  # basic.return: no queue took it
                raise LookupError(
                    f"amqp: {where} routed {routing_key} to no queue (returned unroutable)"
                ) from None
            except aiormq.exceptions.DeliveryError:  # basic.nack
                raise ConnectionError(f"amqp: {where}: the broker nacked the publish") from None
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise LookupError(f"amqp: {where} does not exist") from None
            except aiormq.exceptions.ChannelAccessRefused:
                raise PermissionError(f"amqp: the relay may not publish to {where}") from None
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as exc:
                raise ConnectionError(f"amqp: {where}: {type(exc).__name__}") from None

        return publish

    async def _channel(self) -> AbstractChannel:
        """One of the relay's channels, in turn; a closed one is opened anew.

        Publishes share channels: each awaits its own confirm, so many are in
        flight on one channel at once, and the broker sees a fixed number.
        """
        self._turn = (self._turn + 1) % len(self._channels)
        channel = self._channels[self._turn]
        if channel is None or channel.is_closed:
            connection = await self._connect()
            try:
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            except Exception as exc:
                raise ConnectionError(f"amqp: no channel: {type(exc).__name__}") from None
            self._channels[self._turn] = channel
        return channel

    async def _connect(self) -> AbstractRobustConnection:
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._connection is None:
                import aio_pika

                s = self.settings
                context = None
                if s.ca_file is not None:
                    context = ssl.create_default_context(cafile=str(s.ca_file))
                try:
                    self._connection = await aio_pika.connect_robust(
                        s.url,
                        login=s.username or "guest",
                        password=s.password.get_secret_value() if s.password else "guest",
                        timeout=s.timeout.total_seconds(),
                        # A restarted broker is back in a second, not the default five.
                        reconnect_interval=1,
                        ssl_context=context,
                        client_properties={"connection_name": "outbox-relay"},
                    )
                except Exception as exc:
                    raise ConnectionError(f"amqp: cannot connect: {type(exc).__name__}") from None
            return self._connection

    async def aclose(self) -> None:
        self._channels = [None] * len(self._channels)
        if self._connection is not None:
            with anyio.move_on_after(5):
                await self._connection.close()
        self._connection = None


def _build(settings: AmqpSettings | None, clock: Clock) -> AmqpKind:
    return AmqpKind(settings or AmqpSettings.model_validate({}))


KIND = Kind(
    name="amqp",
    build=_build,
    settings=AmqpSettings,
    secrets=("password",),
    config=AmqpConfig,
    spec_field="amqp",
    spec_names={"exchange": "exchange", "routingKey": "routing_key", "orderingKey": "ordering_key"},
    topic_fields={"cloudEvents": "cloud_events"},
    extra="amqp",
    modules=("aio_pika", "aiormq", "pamqp"),
    reserved_headers=("ce-",),  # CloudEvents' attributes in binary mode
)
"""The RabbitMQ kind; without its extra, only the topics that name it are refused."""
