"""The webhook handler kind: POST each message to a URL, signed, with its id as key.

Receivers drop repeats by ``Idempotency-Key`` (the message id, the same on
every attempt) and authenticate with ``Outbox-Signature: t=<unix>,v1=<hex>``,
an HMAC-SHA256 over ``"<t>." + body`` with a secret the relay reads from the
environment variable the topic's config names (never from the resource).

2xx delivers. 408, 429 and 5xx retry, after Retry-After when the receiver
sends one; other 4xx bury at once. One aiohttp session (one connection pool)
serves every webhook topic of the relay.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from outbox.errors import Permanent, RetryAfter
from outbox.handlers.config import parse_config
from outbox.message import Message
from outbox.relay import Clock
from outbox.relay.routing import Handler

__all__ = ["WebhookConfig", "WebhookKind", "sign"]

_RETRYABLE = {408, 429}
_MAX_RETRY_AFTER = dt.timedelta(hours=1)


class WebhookConfig(BaseModel):
    """spec.config of a webhook OutboxTopic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: AnyHttpUrl
    secret_env: str | None = Field(default=None, pattern=r"^[A-Z_][A-Z0-9_]*$")
    headers: dict[str, str] = Field(default_factory=dict)


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The Outbox-Signature header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _retry_after(value: str | None, now: dt.datetime) -> dt.timedelta | None:
    if not value:
        return None
    if value.strip().isdigit():
        delay = dt.timedelta(seconds=int(value.strip()))
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        delay = when - now
    return max(dt.timedelta(0), min(delay, _MAX_RETRY_AFTER))


class WebhookKind:
    """Builds webhook handlers; owns the shared HTTP session (close with aclose())."""

    def __init__(self, clock: Clock, allow: Sequence[str] = ()) -> None:
        self.clock = clock
        self.allow = tuple(allow)
        """URL prefixes a topic may send to (OUTBOX_WEBHOOK_ALLOW); empty: any."""
        self._session: aiohttp.ClientSession | None = None

    def __call__(self, config: Mapping[str, Any]) -> Handler:
        cfg = parse_config(WebhookConfig, config)
        for name in cfg.headers:
            if name.lower() in ("authorization", "cookie") or "\n" in name:
                raise ValueError(f"headers: {name} must not be set from config (no secrets)")
        url = str(cfg.url)
        if self.allow and not any(url.startswith(prefix) for prefix in self.allow):
            raise ValueError(
                f"url {url} is not under OUTBOX_WEBHOOK_ALLOW ({', '.join(self.allow)})"
            )

        async def deliver(m: Message) -> None:
            headers = {
                **cfg.headers,
                "Content-Type": "application/json",
                "Idempotency-Key": str(m.id),
                "Outbox-Topic": m.topic,
                "Outbox-Attempt": str(m.attempts),
            }
            if cfg.secret_env:
                secret = os.environ.get(cfg.secret_env)
                if not secret:
                    raise RuntimeError(f"webhook secret variable {cfg.secret_env} is not set")
                stamp = int(self.clock().timestamp())
                headers["Outbox-Signature"] = sign(secret.encode(), stamp, m.payload)
            async with self._client().post(url, data=m.payload, headers=headers) as response:
                status = response.status
                if 200 <= status < 300:
                    return
                text = (await response.text(errors="replace"))[:200]
                reason = f"webhook: HTTP {status} from {url}: {' '.join(text.split())}"
                if status in _RETRYABLE or status >= 500:
                    delay = _retry_after(response.headers.get("Retry-After"), self.clock())
                    if delay is not None:
                        raise RetryAfter(delay, reason)
                    raise ConnectionError(reason)
                raise Permanent(reason)

        return deliver

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100),
                # The relay's deadline bounds each delivery; no second clock here.
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
