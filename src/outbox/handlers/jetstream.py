"""The nats handler kind: publish each message to a JetStream subject, deduplicated.

Every publish carries ``Nats-Msg-Id: <message id>``, so the stream's duplicate
window drops a redelivery (a relay that published and crashed before its ack).
A message counts as delivered only when the stream acknowledges it. One
connection per relay serves every nats topic and reconnects by itself.

Subjects of the server's own APIs (``$JS.API``, ``$KV``, ``$SYS``, ``_INBOX``)
are refused whatever the relay's NATS user may publish to, and
OUTBOX_NATS_ALLOW narrows the rest to the prefixes the deployer lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

from outbox.clock import Clock
from outbox.handler import Handler, Kind
from outbox.handlers.allow import check_subject
from outbox.handlers.cloudevents import ce_headers
from outbox.handlers.config import parse_config
from outbox.handlers.settings import NatsSettings
from outbox.message import Message
from outbox.tracing import tracing, with_trace

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

__all__ = ["KIND", "NatsConfig", "NatsKind"]


class NatsConfig(BaseModel):
    """spec.config of a nats OutboxTopic."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    subject: str = Field(pattern=r"^[^\s*>]+$", max_length=255)
    cloud_events: bool = Field(default=False, alias="cloudEvents")


class NatsKind:
    """Builds nats handlers; owns the relay's one NATS connection (close with aclose())."""

    def __init__(self, settings: NatsSettings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._lock: anyio.Lock | None = None

    def __call__(self, config: Mapping[str, Any]) -> Handler:
        cfg = parse_config(NatsConfig, config)
        check_subject(cfg.subject, self.settings.subjects())
        # The client is an extra: a relay without it runs, and refuses only
        # the topics that name this kind.
        try:
            import nats.js.errors
        except ImportError:
            raise ValueError("the nats handler kind needs outbox-relay[nats] installed") from None

        async def publish(m: Message) -> None:
            js = await self._jetstream()
            headers = {
                **(with_trace(m.headers) if tracing() else m.headers),
                **(ce_headers(m) if cfg.cloud_events else {}),
                "Nats-Msg-Id": str(m.id),
                "Outbox-Topic": m.topic,
                "Outbox-Attempt": str(m.attempts),
            }
            try:
                await js.publish(cfg.subject, m.payload, headers=headers)
            except nats.js.errors.NoStreamResponseError:
                raise LookupError(
                    f"nats: no JetStream stream captures subject {cfg.subject}"
                ) from None

        return publish

    async def _jetstream(self) -> JetStreamContext:
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._client is None or self._client.is_closed:
                import nats

                s = self.settings
                self._client = await nats.connect(
                    servers=s.servers(),
                    user=s.user,
                    password=s.password.get_secret_value() if s.password else None,
                    token=s.token.get_secret_value() if s.token else None,
                    user_credentials=str(s.creds_file) if s.creds_file else None,
                    connect_timeout=s.connect_timeout.total_seconds(),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                )
                self._js = self._client.jetstream()
            assert self._js is not None
            return self._js

    async def aclose(self) -> None:
        if self._client is not None and not self._client.is_closed:
            await self._client.close()
        self._client = self._js = None


def _build(settings: NatsSettings | None, clock: Clock) -> NatsKind:
    return NatsKind(settings or NatsSettings.model_validate({}))


KIND = Kind(
    name="nats",
    build=_build,
    settings=NatsSettings,
    secrets=("password", "token"),
    config=NatsConfig,
    spec_field="nats",
    spec_names={"subject": "subject"},
    topic_fields={"cloudEvents": "cloud_events"},
    extra="nats",
    modules=("nats",),
    reserved_headers=("nats-", "ce-"),  # NATS's own (Nats-Msg-Id dedupes), CloudEvents'
)
"""The NATS JetStream kind; without its extra, only the topics that name it are refused."""
