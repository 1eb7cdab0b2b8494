"""The webhook handler kind: POST each message to a URL, signed, with its id as key.

Receivers drop repeats by ``Idempotency-Key`` or ``webhook-id`` (both the
message id, the same on every attempt) and authenticate with the Standard
Webhooks signature (``outbox.webhooks.verify``), keyed by a secret the relay
reads from an ``OUTBOX_WEBHOOK_SECRET_*`` variable the topic's config names
(never from the resource, never any other variable of the relay).

2xx delivers. 408, 429 and 5xx retry, after Retry-After when the receiver
sends one; 3xx is a failed attempt (redirects are never followed: the allow
list is checked once, on the configured URL); other 4xx bury at once. Reasons
name the URL's origin and the status only: a receiver's body (which may echo
the payload) and the URL's path and query (which may be a capability) stay
out of ``last_error`` and the logs, and no body is read. One aiohttp session
serves every webhook topic of the relay.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict
from pydantic import BaseModel, ConfigDict, Field, field_validator

from outbox.clock import Clock
from outbox.errors import Permanent, RetryAfter
from outbox.handler import Handler, Kind
from outbox.handlers.allow import UrlPrefix, origin, parse_url
from outbox.handlers.cloudevents import ce_headers
from outbox.handlers.config import parse_config
from outbox.handlers.settings import WebhookSettings
from outbox.headers import check_header
from outbox.message import Message
from outbox.tracing import tracing, with_trace
from outbox.webhooks import signature_headers

if TYPE_CHECKING:
    import aiohttp

__all__ = ["KIND", "SECRET_PREFIX", "WebhookConfig", "WebhookKind"]

SECRET_PREFIX = "OUTBOX_WEBHOOK_SECRET_"
"""The only variables a topic may name as its signing secret."""
MAX_HEADERS = 20

_RETRYABLE = {408, 429}
_MAX_RETRY_AFTER = dt.timedelta(hours=1)


class WebhookConfig(BaseModel):
    """spec.config of a webhook OutboxTopic."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    url: str = Field(max_length=2048)
    secret_env: str | None = Field(
        default=None, pattern=rf"^{SECRET_PREFIX}[A-Z0-9_]+$", max_length=200
    )
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    cloud_events: bool = Field(default=False, alias="cloudEvents")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_url(value)
        return value.strip()

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        # The rules of message headers (outbox.headers): a resource that set
        # Content-Length: 0 would ack a lost message, Host reach another
        # virtual host, a signature header forge one.
        for name, text in value.items():
            check_header(name, text, max_value=1024)
        return value


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
        self.allow = tuple(UrlPrefix.parse(p) for p in allow)
        """Where topics may send (OUTBOX_WEBHOOK_ALLOW); empty: nowhere."""
        self._session: aiohttp.ClientSession | None = None

    def check(self, config: Mapping[str, Any]) -> WebhookConfig:
        """``config`` parsed, or ValueError when relays may not send where it says."""
        cfg = parse_config(WebhookConfig, config)
        url = parse_url(cfg.url)
        if not self.allow:
            raise ValueError(
                "OUTBOX_WEBHOOK_ALLOW is empty, so webhook topics may send nowhere; "
                "list the URL prefixes of your receivers there"
            )
        if not any(prefix.admits(url) for prefix in self.allow):
            raise ValueError(
                f"url {origin(url)}/... is not under OUTBOX_WEBHOOK_ALLOW "
                f"({', '.join(map(str, self.allow))})"
            )
        return cfg

    def __call__(self, config: Mapping[str, Any]) -> Handler:
        # Imported by a relay that delivers to a webhook, not by every command
        # that reads a topic's config (the CLI starts faster without it).
        import aiohttp

        cfg = self.check(config)
        url = cfg.url
        where = origin(parse_url(url))

        async def deliver(m: Message) -> None:
            # The message's headers (with the delivery's trace context when the
            # relay traces), then the topic's, then the relay's own; names are
            # case-insensitive, so a later one replaces an earlier one.
            headers = CIMultiDict(with_trace(m.headers) if tracing() else m.headers)
            headers.update(cfg.headers)
            if cfg.cloud_events:
                headers.update(ce_headers(m))
            headers.update(
                {
                    "Content-Type": "application/json",
                    "Idempotency-Key": str(m.id),
                    "Outbox-Topic": m.topic,
                    "Outbox-Attempt": str(m.attempts),
                }
            )
            if cfg.secret_env:
                secret = os.environ.get(cfg.secret_env)
                if not secret:
                    raise RuntimeError(f"webhook secret variable {cfg.secret_env} is not set")
                stamp = int(self.clock().timestamp())
                headers.update(signature_headers(secret, str(m.id), stamp, m.payload))
            try:
                response = await self._client().post(
                    url, data=m.payload, headers=headers, allow_redirects=False
                )
            except aiohttp.ClientError as exc:
                raise ConnectionError(f"webhook: {where}: {type(exc).__name__}") from None
            # The body is never read: released unread, the connection closes,
            # and a receiver's gigabytes never reach the relay's memory.
            async with response:
                status = response.status
                if 200 <= status < 300:
                    return
                reason = f"webhook: HTTP {status} from {where}"
                if 300 <= status < 400:
                    raise ConnectionError(f"{reason} (a redirect; redirects are not followed)")
                if status in _RETRYABLE or status >= 500:
                    delay = _retry_after(response.headers.get("Retry-After"), self.clock())
                    if delay is not None:
                        raise RetryAfter(delay, reason)
                    raise ConnectionError(reason)
                raise Permanent(reason)

        return deliver

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100),
                # The relay's deadline bounds each delivery; no second clock here.
                timeout=aiohttp.ClientTimeout(total=None),
                # Redirects are refused per request too; no cookies are kept.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _build(settings: WebhookSettings | None, clock: Clock) -> WebhookKind:
    return WebhookKind(clock, settings.prefixes() if settings else [])


KIND = Kind(
    name="webhook",
    build=_build,
    settings=WebhookSettings,
    config=WebhookConfig,
    spec_field="webhook",
    spec_names={"url": "url", "secretEnv": "secret_env", "headers": "headers"},
    topic_fields={"cloudEvents": "cloud_events"},
    # HTTP framing and credentials, Standard Webhooks' signature, CloudEvents'.
    reserved_headers=(
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "expect",
        "host",
        "idempotency-key",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-",
        "sec-",
        "webhook-",
        "ce-",
    ),
)
"""The webhook kind (aiohttp comes with the relay)."""
