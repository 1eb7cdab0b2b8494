"""Settings read from the environment (prefix OUTBOX_), validated at the edge.

Durations are parsed here, from strings like ``250ms`` or ``1m30s``, and are
``timedelta`` everywhere else. :func:`load` turns a validation failure into a
:class:`~outbox.errors.ConfigError` that names the variable.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.durations import format_duration
from outbox.errors import ConfigError
from outbox.handlers import KINDS
from outbox.handlers.settings import (
    AmqpSettings,
    NatsSettings,
    RedisSettings,
    SmtpSettings,
    WebhookSettings,
    lower,
)
from outbox.message import parse_size, validate_topic
from outbox.relay.config import RelayConfig
from outbox.settings import ENV_PREFIX, Duration, config_error, load

__all__ = [
    "ENV_PREFIX",
    "KIND_SETTINGS",
    "AmqpSettings",
    "ControllerSettings",
    "Duration",
    "NatsSettings",
    "RedisSettings",
    "RelayConfig",
    "RelaySettings",
    "ServiceSettings",
    "SmtpSettings",
    "UiSettings",
    "WebhookSettings",
    "config_error",
    "kind_settings",
    "load",
    "relay_config",
    "variables",
]


class RelaySettings(BaseSettings, RelayConfig):
    """RelayConfig read from OUTBOX_<NAME>: what `outbox relay` runs with."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)


def _size(text: str) -> str:
    """OUTBOX_MAX_PAYLOAD checked by the producers' own parser (outbox.message)."""
    parse_size(text)
    return text


def relay_config(**overrides: Any) -> RelayConfig:
    """The RelayConfig OUTBOX_* sets (``overrides`` win); ConfigError names a bad one.

    What `outbox relay` runs with; an application that runs a relay itself and
    wants the same variables calls it too.
    """
    return RelayConfig.model_validate(load(RelaySettings, **overrides).model_dump())


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
    listen_url: SecretStr | None = Field(
        default=None,
        description=(
            "Where a relay LISTENs for wake-ups, when OUTBOX_DATABASE_URL goes through a "
            "transaction pooler: a direct or session-mode URL to the same database. Unset: "
            "OUTBOX_DATABASE_URL."
        ),
    )
    database_schema: str | None = Field(
        default=None,
        pattern=r"^[a-z_][a-z0-9_]*$",
        max_length=63,
        description=(
            "The schema of the outbox tables. Set: every connection of the process has "
            "search_path pinned to it alone, so no other schema (a role-named one, say) "
            "can shadow them. Unset: the connection's own search_path."
        ),
    )
    data_dir: Path = Field(
        default=Path(".outbox"),
        description="Where the embedded PostgreSQL keeps its data (without OUTBOX_DATABASE_URL).",
    )
    pool_size: int = Field(
        default=4, ge=1, le=200, description="Most database connections one process opens."
    )
    prepared_statements: bool = Field(
        default=False,
        description=(
            "Prepare the relay's statements on the server (psycopg, after 5 runs). Off: "
            "safe behind a transaction pooler; see BENCHMARKS.md for what it is worth."
        ),
    )
    max_payload: Annotated[str, AfterValidator(_size)] = Field(
        default="1MiB",
        description=(
            "Largest payload (bytes of JSON, or KiB/MiB) a producer may add; every "
            "producer path refuses a larger one. Read by producers from their own "
            "environment, once a process."
        ),
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
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(lower)] = (
        Field(default="info", description="Least severe log level written.")
    )
    log_format: Annotated[Literal["auto", "json", "text"], BeforeValidator(lower)] = Field(
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


KIND_SETTINGS: tuple[type[BaseSettings], ...] = tuple(
    kind.settings for kind in KINDS if kind.settings is not None
)
"""Every handler kind's OUTBOX_<KIND>_* settings, in KINDS' order."""


def kind_settings() -> dict[str, Any]:
    """Each handler kind's settings, read from the environment, by kind name (for
    HandlerKinds); ConfigError names a bad variable."""
    return {kind.name: load(kind.settings) for kind in KINDS if kind.settings is not None}


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
    grants: str = Field(
        default="",
        max_length=65536,
        description=(
            "Which namespaces' OutboxTopics may govern which topics: NAMESPACE=TOPIC or "
            "NAMESPACE=PREFIX*, with :reroute to send a topic a built-in or application "
            "handler serves to a handler kind; comma-separated. Empty: any namespace, "
            "never rerouting such a topic."
        ),
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


class UiSettings(BaseSettings):
    """The operator console's own settings (prefix OUTBOX_UI_)."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}UI_", extra="ignore", frozen=True)

    host: str = Field(
        default="127.0.0.1",
        description=(
            "Address `outbox ui` listens on. Beyond loopback it needs authentication "
            "(OUTBOX_UI_TOKENS_FILE)."
        ),
    )
    port: int = Field(default=8080, ge=0, le=65535, description="Port `outbox ui` listens on.")
    tokens_file: Path | None = Field(
        default=None,
        description=(
            "File of API tokens, one `NAME ROLE TOKEN` a line (ROLE: viewer or operator; "
            "a mounted Secret, read again when it changes). Unset (and no proxy): every "
            "visitor is a viewer, and the console listens on loopback only."
        ),
    )
    session_key: SecretStr | None = Field(
        default=None,
        min_length=32,
        description=(
            "Key signing the browser's sessions (a Secret; at least 32 characters). "
            "Unset: a key per process, so sessions end with a restart and do not "
            "cross replicas."
        ),
    )
    base_path: str = Field(
        default="",
        pattern=r"^(/[A-Za-z0-9._~-]+)*$",
        description=(
            "Path prefix the console is served under behind an ingress (`/outbox`); "
            "empty: the root."
        ),
    )
    proxy_addresses: str = Field(
        default="",
        description=(
            "Comma-separated addresses or networks (CIDR) of an authenticating proxy "
            "(oauth2-proxy and the like): only requests from them are believed for "
            "their identity headers and X-Forwarded-Proto."
        ),
    )
    proxy_user_header: str = Field(
        default="X-Forwarded-User",
        description="Header a trusted proxy names the signed-in user in.",
    )
    proxy_groups_header: str = Field(
        default="X-Forwarded-Groups",
        description="Header a trusted proxy lists the user's groups in (comma-separated).",
    )
    proxy_operator_groups: str = Field(
        default="",
        description="Comma-separated groups whose members operate (the rest of a proxy's users: "
        "OUTBOX_UI_PROXY_VIEWER_GROUPS).",
    )
    proxy_viewer_groups: str = Field(
        default="",
        description=(
            "Comma-separated groups whose members view; `*`: every user the proxy "
            "signed in. A user in neither list is refused (403)."
        ),
    )
    prometheus_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description=(
            "Prometheus that scrapes the relays (http://prometheus:9090): the overview's "
            "charts of backlog, deliveries and burials. Unset: no charts."
        ),
    )
    trace_url: str | None = Field(
        default=None,
        pattern=r"^https?://.*\{trace_id\}",
        description=(
            "Link to a message's trace, a template with {trace_id} "
            "(https://tempo.example/trace/{trace_id}). Unset: no link."
        ),
    )

    def proxied(self) -> bool:
        """Whether an authenticating proxy is configured."""
        return bool(_listed(self.proxy_addresses))

    def proxy_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """OUTBOX_UI_PROXY_ADDRESSES, each checked."""
        try:
            return [ipaddress.ip_network(a, strict=False) for a in _listed(self.proxy_addresses)]
        except ValueError as exc:
            raise ConfigError("OUTBOX_UI_PROXY_ADDRESSES", str(exc)) from None

    def groups(self) -> tuple[frozenset[str], frozenset[str]]:
        """The operator groups and the viewer groups."""
        operators = frozenset(_listed(self.proxy_operator_groups))
        viewers = frozenset(_listed(self.proxy_viewer_groups))
        if self.proxied() and not operators | viewers:
            raise ConfigError(
                "OUTBOX_UI_PROXY_VIEWER_GROUPS",
                "a proxy is set but no group has a role: list the groups that view "
                "(or `*`) and those that operate (OUTBOX_UI_PROXY_OPERATOR_GROUPS)",
            )
        return operators, viewers


def _listed(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
