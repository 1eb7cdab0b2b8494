"""The handler kinds' own settings (OUTBOX_SMTP_*, OUTBOX_NATS_*, OUTBOX_WEBHOOK_*,
OUTBOX_AMQP_*, OUTBOX_REDIS_*)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    FilePath,
    SecretStr,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.handlers.allow import UrlPrefix
from outbox.settings import ENV_PREFIX, Duration

__all__ = [
    "AmqpSettings",
    "NatsSettings",
    "RedisSettings",
    "SmtpSettings",
    "WebhookSettings",
    "lower",
]


def lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


class SmtpSettings(BaseSettings):
    """Where the mail handlers send email. Mail is enabled when OUTBOX_SMTP_HOST is set."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}SMTP_", extra="ignore", frozen=True)

    host: str | None = Field(
        default=None, description="SMTP server; set it to enable the mail handlers."
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="SMTP port. Default: 25 without TLS, 587 for starttls, 465 for tls.",
    )
    username: str | None = Field(default=None, description="SMTP user, if the server wants AUTH.")
    password: SecretStr | None = Field(default=None, description="SMTP password (a secret).")
    tls: Annotated[Literal["none", "starttls", "tls"], BeforeValidator(lower)] = Field(
        default="starttls",
        description="none, starttls (upgrade a plain connection) or tls (implicit TLS).",
    )
    ca_file: FilePath | None = Field(
        default=None, description="PEM file of extra CAs to trust for the server's certificate."
    )
    from_address: str = Field(
        default="outbox@localhost",
        pattern=r"^[^\s@<>]+@[^\s@<>]+$",
        description="Sender address of every email.",
    )
    message_id_domain: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9.-]+$",
        description="Domain of Message-IDs (<message-id@domain>). Default: the sender's.",
    )
    timeout: Duration = Field(
        default=dt.timedelta(seconds=20),
        gt=dt.timedelta(0),
        description="Longest wait for the SMTP server at each step.",
    )

    @field_validator("tls")
    @classmethod
    def _no_clear_text_password(cls, tls: str, info: ValidationInfo) -> str:
        host = info.data.get("host")
        if tls == "none" and info.data.get("password") is not None and not _loopback(host):
            raise ValueError(
                f"none would send OUTBOX_SMTP_PASSWORD in clear text to {host}; use "
                "starttls or tls (none with a password is for a server on loopback only)"
            )
        return tls

    @property
    def enabled(self) -> bool:
        return bool(self.host)

    def effective_port(self) -> int:
        if self.port is not None:
            return self.port
        return {"none": 25, "starttls": 587, "tls": 465}[self.tls]

    def domain(self) -> str:
        return self.message_id_domain or self.from_address.rpartition("@")[2]


class NatsSettings(BaseSettings):
    """The NATS servers the nats handler publishes to (prefix OUTBOX_NATS_)."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}NATS_", extra="ignore", frozen=True)

    url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URL(s), comma-separated; the client reconnects among them.",
    )
    user: str | None = Field(default=None, description="NATS user, with OUTBOX_NATS_PASSWORD.")
    password: SecretStr | None = Field(default=None, description="NATS password (a secret).")
    token: SecretStr | None = Field(default=None, description="NATS token (a secret).")
    creds_file: FilePath | None = Field(
        default=None, description="NATS credentials file (JWT/NKey)."
    )
    connect_timeout: Duration = Field(
        default=dt.timedelta(seconds=2),
        gt=dt.timedelta(0),
        description="Longest wait for one connection attempt.",
    )
    allow: str = Field(
        default="",
        pattern=r"^[^*>$]*$",
        description=(
            "Comma-separated subject prefixes nats topics may publish to (like "
            "orders,billing.events), by whole tokens; empty: any subject but the "
            "server's own ($JS, $KV, $SYS, _INBOX)."
        ),
    )

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str) -> str:
        return _schemes(value, ("nats", "tls", "ws", "wss"), "nats://host:4222")

    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]

    def subjects(self) -> tuple[str, ...]:
        return tuple(p.strip().rstrip(".") for p in self.allow.split(",") if p.strip())


class WebhookSettings(BaseSettings):
    """Where webhook topics may send (prefix OUTBOX_WEBHOOK_); relays and controller read it."""

    model_config = SettingsConfigDict(
        env_prefix=f"{ENV_PREFIX}WEBHOOK_", extra="ignore", frozen=True
    )

    allow: str = Field(
        default="",
        description=(
            "Comma-separated URL prefixes webhook topics may POST to (like "
            "https://billing.internal/hooks/), compared as scheme, host, port and whole "
            "path segments; empty: webhook topics may send nowhere."
        ),
    )

    @field_validator("allow")
    @classmethod
    def _prefixes(cls, value: str) -> str:
        if value:
            _schemes(value, ("http", "https"), "https://billing.internal/")
            for item in value.split(","):
                try:
                    UrlPrefix.parse(item)
                except ValueError as exc:
                    raise ValueError(f"{item.strip()!r} {exc}") from None
        return value

    def prefixes(self) -> list[str]:
        return [p.strip() for p in self.allow.split(",") if p.strip()]


class _Broker(BaseSettings):
    """What the broker kinds' settings share: a URL without credentials (``SCHEMES``:
    the plain scheme, then the TLS one), a login, extra CAs for TLS."""

    SCHEMES: ClassVar[tuple[str, str]]

    url: str
    username: str | None = Field(
        default=None, description="User the relay logs in as (amqp: guest when unset)."
    )
    password: SecretStr | None = Field(default=None, description="That user's password (a secret).")
    ca_file: FilePath | None = Field(
        default=None, description="PEM file of extra CAs to trust, for a TLS URL."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        _schemes(value, cls.SCHEMES, f"{cls.SCHEMES[0]}://host")
        if "@" in value.partition("://")[2].partition("/")[0]:
            prefix = cls.model_config.get("env_prefix", "")
            raise ValueError(f"must not carry credentials (user:password@); set {prefix}PASSWORD")
        return value

    @field_validator("ca_file")
    @classmethod
    def _tls_only(cls, value: FilePath | None, info: ValidationInfo) -> FilePath | None:
        # url comes first (the base class declares it), so it is in info.data.
        tls = cls.SCHEMES[1]
        if value is not None and not str(info.data.get("url", "")).startswith(f"{tls}://"):
            prefix = cls.model_config.get("env_prefix", "")
            raise ValueError(f"is for a {tls}:// (TLS) {prefix}URL")
        return value


class RedisSettings(_Broker):
    """The Redis server the redis handler appends to (prefix OUTBOX_REDIS_)."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}REDIS_", extra="ignore", frozen=True)
    SCHEMES = ("redis", "rediss")

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description=(
            "Redis URL: redis://host:port/db, or rediss:// for TLS; credentials go in "
            "OUTBOX_REDIS_USERNAME and OUTBOX_REDIS_PASSWORD, never in the URL."
        ),
    )
    timeout: Duration = Field(
        default=dt.timedelta(seconds=5),
        gt=dt.timedelta(0),
        description="Longest wait for a connection or a reply.",
    )
    allow: str = Field(
        default="",
        description=(
            "Comma-separated streams redis topics may append to; an entry ending in * "
            "admits every stream it starts (like orders:*). Empty: any stream."
        ),
    )

    def streams(self) -> tuple[str, ...]:
        return _names(self.allow)


class AmqpSettings(_Broker):
    """The RabbitMQ broker the amqp handler publishes to (prefix OUTBOX_AMQP_)."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}AMQP_", extra="ignore", frozen=True)
    SCHEMES = ("amqp", "amqps")

    url: str = Field(
        default="amqp://127.0.0.1:5672/",
        description=(
            "Broker URL: amqp://host:port/vhost, or amqps:// for TLS; credentials go in "
            "OUTBOX_AMQP_USERNAME and OUTBOX_AMQP_PASSWORD, never in the URL."
        ),
    )
    timeout: Duration = Field(
        default=dt.timedelta(seconds=10),
        gt=dt.timedelta(0),
        description="Longest wait for a connection, or for the broker to confirm a publish.",
    )
    channels: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Channels a relay publishes on (many publishes in flight on each).",
    )
    allow: str = Field(
        default="",
        description=(
            "Comma-separated exchanges amqp topics may publish to; an entry ending in * "
            "admits every exchange it starts (like orders.*). Empty: any exchange."
        ),
    )

    def exchanges(self) -> tuple[str, ...]:
        return _names(self.allow)


def _loopback(host: str | None) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _schemes(value: str, schemes: tuple[str, ...], example: str) -> str:
    """Refuse a comma-separated list holding anything but URLs with one of ``schemes``."""
    items = [item.strip() for item in value.split(",")]
    for item in items:
        scheme, sep, rest = item.partition("://")
        if not sep or scheme.lower() not in schemes or not rest:
            raise ValueError(
                f"{item!r} is not a URL starting {' or '.join(f'{s}://' for s in schemes)} "
                f"(like {example}); "
                "separate several with commas"
            )
    return value


def _names(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())
