"""Settings read from the environment (prefix OUTBOX_), validated at the edge.

Durations are parsed here, from strings like ``250ms`` or ``1m30s``, and are
``timedelta`` everywhere else. :func:`load` turns a validation failure into a
:class:`~outbox.errors.ConfigError` that names the variable.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, TypeVar

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.durations import format_duration, parse_duration
from outbox.errors import ConfigError

__all__ = ["ENV_PREFIX", "Duration", "RelayConfig", "load"]

ENV_PREFIX = "OUTBOX_"

Duration = Annotated[
    dt.timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]
"""A timedelta that reads ``250ms``, ``2m``, ``1m30s`` or plain seconds."""


class RelayConfig(BaseSettings):
    """Tunes a Relay. Each field is read from OUTBOX_<NAME>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    interval: Duration = Field(
        default=dt.timedelta(seconds=1),
        gt=dt.timedelta(0),
        description="Wait between outbox polls once no message is due.",
    )
    timeout: Duration = Field(
        default=dt.timedelta(seconds=30),
        gt=dt.timedelta(0),
        description="Longest one delivery may take.",
    )
    lease: Duration = Field(
        default=dt.timedelta(minutes=2),
        gt=dt.timedelta(0),
        description="How long a claimed message stays claimed; must outlast the timeout.",
    )
    batch: int = Field(default=10, ge=1, le=10_000, description="Messages claimed per poll.")
    max_attempts: int = Field(
        default=8, ge=1, le=1_000, description="Deliveries tried before a message is buried."
    )

    @field_validator("lease")
    @classmethod
    def _lease_outlasts_timeout(cls, lease: dt.timedelta, info: ValidationInfo) -> dt.timedelta:
        timeout = info.data.get("timeout")
        if timeout is not None and lease <= timeout:
            raise ValueError(
                f"must outlast OUTBOX_TIMEOUT ({format_duration(timeout)}), or a slow "
                f"delivery can overlap its own retry; got {format_duration(lease)}"
            )
        return lease


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
