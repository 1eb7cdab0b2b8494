"""Which handler delivers a topic, and with what limits: built-ins plus the registry.

A topic is delivered by its built-in handler with the OUTBOX_* defaults unless
its registry entry says otherwise: paused (not claimed at all), another
handler (a built-in topic's, or a generic kind such as ``log`` built from the
entry's config), or its own max_attempts and timeout. A topic this relay
cannot deliver as the registry asks (an unknown handler kind, a config the
kind refuses) is left unclaimed rather than buried, so a mistake in the
registry loses nothing; a topic nobody configured and no built-in handles is
buried with "no handler", as the design says.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from outbox.message import Message
from outbox.settings import RelayConfig
from outbox.store import TopicSettings

__all__ = ["Handler", "HandlerKind", "Route", "Router"]

log = logging.getLogger("outbox.routing")

Handler = Callable[[Message], Awaitable[None]]
"""Delivers one message. Raising makes the relay retry it; Permanent buries it."""

HandlerKind = Callable[[Mapping[str, Any]], Handler]
"""A generic handler (``log``, ``webhook``): builds one from a topic's registry config;
raises ValueError for a config it cannot use."""


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """How one topic is delivered. ``handler`` None: there is none; bury."""

    handler: Handler | None
    max_attempts: int
    timeout: dt.timedelta


class Router:
    """Routes topics to handlers; ``exclude`` is what claims must leave alone."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        kinds: Mapping[str, HandlerKind],
        config: RelayConfig,
    ) -> None:
        self.handlers = dict(handlers)
        self.kinds = dict(kinds)
        self.config = config
        self.default = Route(None, config.max_attempts, config.timeout)
        self.routes = {
            t: Route(h, config.max_attempts, config.timeout) for t, h in handlers.items()
        }
        self.exclude: frozenset[str] = frozenset()
        self._built: dict[tuple[str, str], Handler] = {}
        self._complained: set[tuple[str, str]] = set()

    def route(self, topic: str) -> Route:
        return self.routes.get(topic, self.default)

    def update(self, topics: Mapping[str, TopicSettings]) -> None:
        """Rebuild the routes from the registry."""
        cfg = self.config
        routes = {t: Route(h, cfg.max_attempts, cfg.timeout) for t, h in self.handlers.items()}
        exclude = set()
        for t in topics.values():
            handler = self._handler(t) if t.enabled else None
            if handler is None:
                exclude.add(t.topic)
                routes.pop(t.topic, None)
                continue
            timeout = t.timeout or cfg.timeout
            if timeout >= cfg.lease:
                self._complain(t.topic, "timeout", "its timeout does not stay below the lease")
                timeout = cfg.timeout
            routes[t.topic] = Route(handler, t.max_attempts or cfg.max_attempts, timeout)
        self.routes = routes
        self.exclude = frozenset(exclude)

    def _handler(self, t: TopicSettings) -> Handler | None:
        name = t.handler or t.topic
        if name in self.handlers and not t.config:
            return self.handlers[name]
        kind = self.kinds.get(name)
        if kind is None:
            self._complain(t.topic, name, f"this relay has no handler {name!r}; left unclaimed")
            return None
        key = (name, json.dumps(t.config, sort_keys=True))
        if key not in self._built:
            try:
                self._built[key] = kind(t.config)
            except (ValueError, TypeError) as exc:
                self._complain(t.topic, key[1], f"handler {name!r} refused its config: {exc}")
                return None
        return self._built[key]

    def _complain(self, topic: str, what: str, problem: str) -> None:
        if (topic, what) not in self._complained:
            self._complained.add((topic, what))
            log.warning("topic %s: %s", topic, problem)
