"""Settings read from the environment (prefix OUTBOX_), validated at the edge.

Durations are parsed here, from strings like ``250ms`` or ``1m30s``, and are
``timedelta`` everywhere else. :func:`load` turns a validation failure into a
:class:`~outbox.errors.ConfigError` that names the variable.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.durations import format_duration
from outbox.errors import ConfigError
from outbox.message import validate_topic
from outbox.relay.config import Duration, RelayConfig

__all__ = [
    "ENV_PREFIX",
    "ControllerSettings",
    "Duration",
    "NatsSettings",
    "RelayConfig",
    "RelaySettings",
    "ServiceSettings",
    "SmtpSettings",
    "WebhookSettings",
    "config_error",
    "load",
    "variables",
]

ENV_PREFIX = "OUTBOX_"


class RelaySettings(BaseSettings, RelayConfig):
    """RelayConfig read from OUTBOX_<NAME>: what `outbox relay` runs with."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S], **overrides: Any) -> S:
    """Build ``cls`` from the environment; raise ConfigError naming the bad variable."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise config_error(cls, exc) from None


def config_error(cls: type[BaseSettings], exc: ValidationError) -> ConfigError:
    """The first problem of ``exc`` as a ConfigError that names its variable."""
    err = exc.errors(include_url=False, include_input=False)[0]
    prefix = cls.model_config.get("env_prefix", "")
    field = str(err["loc"][0]) if err["loc"] else ""
    variable = f"{prefix}{field}".upper() if field else prefix.rstrip("_") or cls.__name__
    message = str(err["msg"]).removeprefix("Value error, ")
    return ConfigError(variable, message)


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


class ServiceSettings(BaseSettings):
    """How one outbox process runs: its database, HTTP endpoints and logs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    database_url: SecretStr | None = Field(
        default=None,
        description=(
            "PostgreSQL to use, as a libpq URL or conninfo string. Unset: start the "
            "embedded PostgreSQL under OUTBOX_DATA_DIR."
        ),
    )
    data_dir: Path = Field(
        default=Path(".outbox"),
        description="Where the embedded PostgreSQL keeps its data (without OUTBOX_DATABASE_URL).",
    )
    pool_size: int = Field(
        default=4, ge=1, le=200, description="Most database connections one process opens."
    )
    http_host: str = Field(
        default="0.0.0.0", description="Address /metrics, /healthz and /readyz listen on."
    )
    http_port: int = Field(
        default=9090, ge=0, le=65535, description="Port for /metrics, /healthz and /readyz."
    )
    backlog_interval: Duration = Field(
        default=dt.timedelta(seconds=15),
        gt=dt.timedelta(0),
        description="How often a relay counts pending and buried messages per topic.",
    )
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = (
        Field(default="info", description="Least severe log level written.")
    )
    log_format: Annotated[Literal["auto", "json", "text"], BeforeValidator(_lower)] = Field(
        default="auto",
        description="json (one object a line), text, or auto: text on a terminal, else json.",
    )
    handlers: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description=(
            "Application handlers, as module:attribute naming a mapping of topic to "
            "handler or a function that returns one."
        ),
    )
    log_topics: str = Field(
        default="",
        description="Comma-separated topics the log handler delivers (one log line each).",
    )

    def topics_to_log(self) -> list[str]:
        """OUTBOX_LOG_TOPICS as a list, each checked."""
        topics = [t.strip() for t in self.log_topics.split(",") if t.strip()]
        for topic in topics:
            try:
                validate_topic(topic)
            except ValueError as exc:
                raise ConfigError("OUTBOX_LOG_TOPICS", str(exc).removeprefix("outbox: ")) from None
        return topics


def variables(*models: type[BaseSettings]) -> list[tuple[str, str, str]]:
    """(variable, default, description) for every field of ``models``, in order."""
    rows = []
    for model in models:
        prefix = model.model_config.get("env_prefix", "")
        for name, field in model.model_fields.items():
            default = field.default
            if default is None:
                shown = "(unset)"
            elif isinstance(default, dt.timedelta):
                shown = format_duration(default)
            elif isinstance(default, str) and not default:
                shown = "(empty)"
            else:
                shown = str(default)
            rows.append((f"{prefix}{name}".upper(), shown, field.description or ""))
    return rows


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
    tls: Annotated[Literal["none", "starttls", "tls"], BeforeValidator(_lower)] = Field(
        default="starttls",
        description="none, starttls (upgrade a plain connection) or tls (implicit TLS).",
    )
    ca_file: Path | None = Field(
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

    @property
    def enabled(self) -> bool:
        return bool(self.host)

    def effective_port(self) -> int:
        if self.port is not None:
            return self.port
        return {"none": 25, "starttls": 587, "tls": 465}[self.tls]

    def domain(self) -> str:
        return self.message_id_domain or self.from_address.rpartition("@")[2]


class ControllerSettings(BaseSettings):
    """The OutboxTopic controller's own settings (prefix OUTBOX_CONTROLLER_)."""

    model_config = SettingsConfigDict(
        env_prefix=f"{ENV_PREFIX}CONTROLLER_", extra="ignore", frozen=True
    )

    status_interval: Duration = Field(
        default=dt.timedelta(seconds=30),
        gt=dt.timedelta(0),
        description="How often each OutboxTopic's status (backlog, conditions) is refreshed.",
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=2**31 - 1,
        description=(
            "kopf peering priority; 0: a random one per process, so two replicas never tie "
            "(a tie pauses both)."
        ),
    )
    peering: str = Field(
        default="outbox-relay",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="kopf peering object: of the replicas sharing it, only one acts.",
    )
    metrics_port: int = Field(
        default=9091, ge=1, le=65535, description="Port of the controller's /metrics."
    )
    health_port: int = Field(
        default=8080, ge=1, le=65535, description="Port of the controller's /healthz."
    )


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
    creds_file: Path | None = Field(default=None, description="NATS credentials file (JWT/NKey).")
    connect_timeout: Duration = Field(
        default=dt.timedelta(seconds=2),
        gt=dt.timedelta(0),
        description="Longest wait for one connection attempt.",
    )

    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]


class WebhookSettings(BaseSettings):
    """Where webhook topics may send (prefix OUTBOX_WEBHOOK_); relays and controller read it."""

    model_config = SettingsConfigDict(
        env_prefix=f"{ENV_PREFIX}WEBHOOK_", extra="ignore", frozen=True
    )

    allow: str = Field(
        default="",
        description=(
            "Comma-separated URL prefixes webhook topics may POST to (like "
            "https://billing.internal/); empty: any URL."
        ),
    )

    def prefixes(self) -> list[str]:
        return [p.strip() for p in self.allow.split(",") if p.strip()]
