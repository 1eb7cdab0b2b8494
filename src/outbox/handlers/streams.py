"""The redis handler kind: append each message to a Redis stream (XADD).

Each entry holds the fields ``id`` (the message id), ``topic``, ``key`` (when
the message has one), ``payload`` (its JSON bytes) and ``headers`` (a JSON
object, when it has any). A message counts as delivered once Redis answered
the XADD. Redis has no duplicate window, so a relay that appended and died
before its ack appends again: consumers drop repeats by the ``id`` field (a
``SET outbox:seen:<id> 1 NX EX 86400`` before acting, say). ``maxLen`` trims
the stream approximately (``MAXLEN ~``), so trimming never costs a full scan.

One client per relay (a small connection pool) serves every redis topic and
reconnects by itself; OUTBOX_REDIS_ALLOW narrows the streams topics may name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from outbox.clock import Clock
from outbox.handler import Handler, Kind
from outbox.handlers.allow import check_name
from outbox.handlers.config import parse_config
from outbox.handlers.settings import RedisSettings
from outbox.message import Message
from outbox.tracing import tracing, with_trace

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.typing import EncodableT, FieldT

__all__ = ["KIND", "RedisConfig", "RedisKind"]


class RedisConfig(BaseModel):
    """spec.redis (or --config) of a redis OutboxTopic."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    stream: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._\-{}]*$", max_length=200)
    max_len: int | None = Field(default=None, alias="maxLen", ge=1, le=10**12)


class RedisKind:
    """Builds redis handlers; owns the relay's one Redis client (close with aclose())."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self._client: Redis | None = None

    def __call__(self, config: Mapping[str, Any]) -> Handler:
        cfg = parse_config(RedisConfig, config)
        check_name("stream", cfg.stream, self.settings.streams(), "OUTBOX_REDIS_ALLOW")
        try:
            import redis.exceptions
        except ImportError:
            raise ValueError("the redis handler kind needs outbox-relay[redis] installed") from None

        async def append(m: Message) -> None:
            fields: dict[FieldT, EncodableT] = {"id": str(m.id), "topic": m.topic}
            if m.key is not None:
                fields["key"] = m.key
            fields["payload"] = m.payload
            headers = with_trace(m.headers) if tracing() else m.headers
            if headers:
                fields["headers"] = json.dumps(headers, separators=(",", ":"))
            try:
                await self._redis().xadd(cfg.stream, fields, maxlen=cfg.max_len, approximate=True)
            except redis.exceptions.ConnectionError as exc:
                raise ConnectionError(f"redis: {_first(exc)}") from None
            except redis.exceptions.RedisError as exc:  # WRONGTYPE, OOM, NOPERM...
                raise RuntimeError(f"redis: {_first(exc)}") from None

        return append

    def _redis(self) -> Redis:
        if self._client is None:
            from redis.asyncio import BlockingConnectionPool, Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import ExponentialBackoff

            s = self.settings
            timeout = s.timeout.total_seconds()
            tls: dict[str, Any] = {}
            if s.ca_file is not None:  # a rediss:// URL (the settings check)
                tls["ssl_ca_certs"] = str(s.ca_file)
            pool = BlockingConnectionPool.from_url(
                s.url,
                # Deliveries beyond these wait for a connection (up to the
                # timeout) instead of failing.
                max_connections=32,
                timeout=timeout,
                username=s.username,
                password=s.password.get_secret_value() if s.password else None,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                # A dropped connection is retried once at once (a restarted
                # server); anything longer is the relay's retry, with backoff.
                retry=Retry(ExponentialBackoff(cap=timeout), 1),
                health_check_interval=30,
                **tls,
            )
            self._client = Redis(connection_pool=pool)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            await self._client.connection_pool.aclose()
            self._client = None


def _first(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _build(settings: RedisSettings | None, clock: Clock) -> RedisKind:
    return RedisKind(settings or RedisSettings.model_validate({}))


KIND = Kind(
    name="redis",
    build=_build,
    settings=RedisSettings,
    secrets=("password",),
    config=RedisConfig,
    spec_field="redis",
    spec_names={"stream": "stream", "maxLen": "max_len"},
    extra="redis",
    modules=("redis",),
)
"""The Redis Streams kind; without its extra, only the topics that name it are refused."""
