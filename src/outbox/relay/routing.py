"""Which handler delivers a topic, and with what limits: built-ins plus the registry.

A topic is delivered by its built-in handler with the OUTBOX_* defaults unless
its registry entry says otherwise: paused (served but not claimed), another
handler (a built-in topic's, or a generic kind such as ``log`` built from the
entry's config), its own max_attempts, timeout and max_in_flight. A relay
claims only the topics it can deliver; a topic it cannot deliver as the
registry asks (an unknown handler kind, a config the kind refuses) is left to
the relays that can, and a topic nobody serves is buried with "no handler"
only after the fleet grace (see outbox.relay.fleet), so a mistake in the
registry or a rolling deploy loses nothing. An entry may replace a handler
the relay has of its own (built-in or the application's) only when its
source holds a reroute grant (``TopicSettings.reroute``): an OutboxTopic
author cannot send a sign-in code elsewhere by getting there first.

Handlers may be ``async def`` (run on the event loop) or plain ``def`` (run in
worker threads, at most ``THREADS`` at a time, so a blocking SMTP library
cannot stall the relay).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import json
import logging
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread

from outbox.handler import AsyncHandler, Handler, HandlerKind
from outbox.message import Message
from outbox.relay.config import RelayConfig
from outbox.store import TopicSettings

__all__ = ["THREADS", "Handler", "HandlerKind", "Route", "Router", "Threads", "as_async"]

log = logging.getLogger("outbox.routing")

THREADS = 16
"""Most synchronous handlers running at once in one relay."""


class Threads:
    """The worker threads of one relay's plain ``def`` handlers: at most ``THREADS``."""

    def __init__(self, size: int = THREADS) -> None:
        self.size = size
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:  # made in the event loop that uses it
            self._limiter = anyio.CapacityLimiter(self.size)
        return self._limiter


def as_async(handler: Handler, threads: Threads | None = None) -> AsyncHandler:
    """``handler`` as an ``async`` callable: plain functions run in worker threads.

    A thread cannot be cancelled: at the timeout the relay stops waiting for it
    (and retries the message) while the thread runs on to its end.
    """
    if _is_async(handler):
        return handler  # type: ignore[return-value]
    pool = threads or Threads()

    @functools.wraps(handler)
    async def in_thread(m: Message) -> None:
        result = await anyio.to_thread.run_sync(
            handler, m, limiter=pool.limiter, abandon_on_cancel=True
        )
        if inspect.isawaitable(result):  # a lambda or partial returning a coroutine
            await result

    return in_thread


def _is_async(handler: Any) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """How one topic is delivered."""

    handler: AsyncHandler
    max_attempts: int
    timeout: dt.timedelta
    max_in_flight: int | None = None
    seconds: float = 0.0
    """``timeout`` in seconds, computed once."""

    @classmethod
    def of(
        cls,
        handler: AsyncHandler,
        max_attempts: int,
        timeout: dt.timedelta,
        max_in_flight: int | None,
    ) -> Route:
        return cls(handler, max_attempts, timeout, max_in_flight, timeout.total_seconds())


class Router:
    """Routes topics to handlers and says which topics a claim may take."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        kinds: Mapping[str, HandlerKind],
        config: RelayConfig,
    ) -> None:
        self.threads = Threads()
        self.handlers = {t: as_async(h, self.threads) for t, h in handlers.items()}
        self.kinds = dict(kinds)
        self.config = config
        self._built: dict[tuple[str, str], AsyncHandler] = {}
        self._complained: set[tuple[str, str]] = set()
        self.update({})

    def route(self, topic: str) -> Route | None:
        """How ``topic`` is delivered, or None when this relay cannot deliver it."""
        return self.routes.get(topic)

    def update(self, topics: Mapping[str, TopicSettings]) -> None:
        """Rebuild the routes from the registry."""
        cfg = self.config
        routes = {
            t: Route.of(h, cfg.max_attempts, cfg.timeout, cfg.max_in_flight)
            for t, h in self.handlers.items()
        }
        paused = set()
        for t in topics.values():
            handler = self._handler(t)
            if handler is None:
                routes.pop(t.topic, None)
                continue
            if not t.enabled:
                paused.add(t.topic)
            timeout = t.timeout or cfg.timeout
            if timeout >= cfg.lease:
                self._complain(t.topic, "timeout", "its timeout does not stay below the lease")
                timeout = cfg.timeout
            cap = t.max_in_flight or cfg.max_in_flight
            routes[t.topic] = Route.of(handler, t.max_attempts or cfg.max_attempts, timeout, cap)
        self.routes = routes
        self.served: frozenset[str] = frozenset(routes)
        """Topics this relay can deliver (paused ones too): what it registers."""
        claimable = [t for t in sorted(routes) if t not in paused]
        self.claimable: frozenset[str] = frozenset(claimable)
        """Topics a claim may take now (served and not paused)."""
        self.free: list[str] = [t for t in claimable if routes[t].max_in_flight is None]
        """Claimable topics without a cap on deliveries in flight."""
        self.capped: dict[str, int] = {
            t: cap for t in claimable if (cap := routes[t].max_in_flight) is not None
        }
        """Claimable topics with a cap, and the cap."""

    def _handler(self, t: TopicSettings) -> AsyncHandler | None:
        name = t.handler or t.topic
        if name in self.handlers and not t.config:
            return self.handlers[name]
        own = self.handlers.get(t.topic)
        if own is not None and not t.reroute:
            # Whoever may write an OutboxTopic must not send a topic this
            # relay delivers itself (a sign-in code, an order) to a URL of
            # theirs: only an entry whose source holds a reroute grant may.
            self._complain(
                t.topic,
                f"reroute:{name}",
                f"the entry of {t.source or 'unknown source'} sends it to handler {name!r} "
                "without a reroute grant; this relay keeps its own handler",
            )
            return own
        kind = self.kinds.get(name)
        if kind is None:
            self._complain(t.topic, name, f"this relay has no handler {name!r}; left unclaimed")
            return None
        key = (name, json.dumps(t.config, sort_keys=True))
        if key not in self._built:
            try:
                self._built[key] = as_async(kind(t.config), self.threads)
            except (ValueError, TypeError) as exc:
                self._complain(t.topic, key[1], f"handler {name!r} refused its config: {exc}")
                return None
        return self._built[key]

    def _complain(self, topic: str, what: str, problem: str) -> None:
        if (topic, what) not in self._complained:
            self._complained.add((topic, what))
            log.warning("topic %s: %s", topic, problem)
