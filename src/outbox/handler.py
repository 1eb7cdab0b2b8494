"""The handler contract: what delivers a message, what builds one from a topic's
config, and the record that describes a handler kind whole.

A leaf (no third-party import): handler kinds, the controller's validation and
the relay all speak it, and none of them needs the others to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from outbox.clock import Clock
from outbox.message import Message

__all__ = ["AsyncHandler", "BuiltKind", "Handler", "HandlerKind", "Kind"]

Handler = Callable[[Message], Awaitable[None]] | Callable[[Message], None]
"""Delivers one message: ``async def`` or plain ``def``. Raising makes the relay
retry it; Permanent buries it."""

HandlerKind = Callable[[Mapping[str, Any]], Handler]
"""A generic handler (``log``, ``webhook``): builds one from a topic's registry config;
raises ValueError for a config it cannot use."""

AsyncHandler = Callable[[Message], Awaitable[None]]
"""A handler the relay awaits (plain ``def`` handlers are wrapped into one)."""


class BuiltKind(Protocol):
    """A kind as one relay (or controller) holds it: builds handlers from topics'
    configs and owns what they share (a session, a connection)."""

    def __call__(self, config: Mapping[str, Any], /) -> Handler: ...

    async def aclose(self) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kind:
    """One handler kind an OutboxTopic's spec.handler (or `outbox topics set
    --handler`) names, described whole: each kind module declares one, and
    outbox.handlers.KINDS lists them all. The process, the CLI, secret
    redaction, the controller and the docs iterate that tuple; none names a kind.
    """

    name: str
    """What spec.handler names."""
    build: Callable[[Any, Clock], BuiltKind]
    """Makes the kind from its loaded settings (None when it has none) and the clock.
    Does no I/O: the controller validates configs with what it builds."""
    settings: type[Any] | None = None
    """Its OUTBOX_<KIND>_* settings (a pydantic-settings model), if any."""
    secrets: tuple[str, ...] = ()
    """The fields of ``settings`` that hold secrets: hidden from every log line."""
    config: type[Any] | None = None
    """The model a topic's config must fit (a pydantic model), if any."""
    spec_field: str | None = None
    """The OutboxTopic field that carries its config (spec.<spec_field>)."""
    spec_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """That field's names (camelCase, as in the CRD) -> the config's keys."""
    topic_fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """OutboxTopic fields at the top of the spec (camelCase) the kind takes into
    its config too -> the config's keys (spec.cloudEvents, say)."""
    extra: str | None = None
    """The pip extra that installs what it needs (None: the relay's own)."""
    modules: tuple[str, ...] = ()
    """The top-level modules that extra brings."""
    reserved_headers: tuple[str, ...] = ()
    """Header names (lower-case; ending in ``-``: a prefix) its transport gives
    meaning to, which no message or topic config may set: the core refuses
    them when a message is made (outbox.headers.RESERVED holds the union)."""

    def config_of(self, typed: Mapping[str, Any]) -> dict[str, Any]:
        """spec.<spec_field> in the relays' spelling (unset and empty values left out)."""
        return {
            self.spec_names[name]: value
            for name, value in typed.items()
            if name in self.spec_names and value not in (None, "", {}, [])
        }
