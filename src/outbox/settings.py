"""Reading OUTBOX_* settings: the prefix, durations, and errors that name the variable.

A small leaf (pydantic only) that the relay, the handler kinds, the controller
and the service all read their settings with, none of them through another.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator, PlainSerializer, ValidationError
from pydantic_settings import BaseSettings

from outbox.durations import format_duration, parse_duration
from outbox.errors import ConfigError

__all__ = ["ENV_PREFIX", "SETTING_LONGEST", "Duration", "config_error", "load"]

ENV_PREFIX = "OUTBOX_"

SETTING_LONGEST = dt.timedelta(days=30)
"""The longest duration a setting takes: a lease or a timeout of months is a
typo, and ``now + lease`` must never overflow."""


def _bounded(value: dt.timedelta) -> dt.timedelta:
    if value > SETTING_LONGEST:
        raise ValueError(
            f"{format_duration(value)} is too long for this setting (at most "
            f"{format_duration(SETTING_LONGEST)})"
        )
    return value


Duration = Annotated[
    dt.timedelta,
    BeforeValidator(parse_duration),
    AfterValidator(_bounded),
    PlainSerializer(format_duration, return_type=str),
]
"""A timedelta that reads ``250ms``, ``2m``, ``1m30s`` or plain seconds, at most 30 days."""

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
