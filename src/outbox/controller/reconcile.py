"""What the controller does, as plain functions: OutboxTopic spec -> registry row + status.

Reconciling is level-based: it compares the registry with the spec and writes
what differs, so running it again (a watch replay, the status timer) is
harmless. Two resources that name the same topic conflict; the one that holds
the topic in the registry first (normally the older) wins, the other reports
a Conflict condition until the holder is gone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from outbox.durations import format_duration, parse_duration
from outbox.errors import OutboxError
from outbox.message import validate_topic
from outbox.relay import HandlerKind
from outbox.store import Store, TopicSettings

__all__ = ["InvalidSpec", "Outcome", "backlog", "desired", "forget", "reconcile", "source_of"]

SOURCE_PREFIX = "kubernetes:"


class InvalidSpec(OutboxError):
    """The OutboxTopic's spec cannot be applied; the message says why."""


def source_of(namespace: str | None, name: str) -> str:
    """How a resource is named in the registry's source column."""
    return f"{SOURCE_PREFIX}{namespace or ''}/{name}"


def desired(
    spec: Mapping[str, Any],
    *,
    lease: dt.timedelta,
    builtin_topics: frozenset[str],
    kinds: Mapping[str, HandlerKind],
) -> TopicSettings:
    """The registry entry ``spec`` asks for; raises InvalidSpec with a human reason."""
    topic = spec.get("topic")
    if not isinstance(topic, str):
        raise InvalidSpec("spec.topic is required")
    try:
        validate_topic(topic)
    except ValueError as exc:
        raise InvalidSpec(f"spec.topic: {str(exc).removeprefix('outbox: ')}") from None
    handler = spec.get("handler")
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        raise InvalidSpec("spec.config must be an object")
    if handler is None:
        if topic not in builtin_topics:
            raise InvalidSpec(
                f"{topic} has no built-in handler; set spec.handler to one of {sorted(kinds)}"
            )
    elif handler in kinds:
        try:
            kinds[handler](config)
        except (ValueError, TypeError) as exc:
            raise InvalidSpec(f"spec.config for handler {handler}: {exc}") from None
    elif handler not in builtin_topics:
        known = sorted(set(kinds) | builtin_topics)
        raise InvalidSpec(f"spec.handler {handler!r} is unknown; known: {known}")
    timeout = None
    if spec.get("timeout") is not None:
        try:
            timeout = parse_duration(str(spec["timeout"]))
        except ValueError as exc:
            raise InvalidSpec(f"spec.timeout: {exc}") from None
        if timeout >= lease:
            raise InvalidSpec(
                f"spec.timeout {format_duration(timeout)} does not stay below the relays' "
                f"lease ({format_duration(lease)}): a slow delivery could overlap its retry"
            )
    max_attempts = spec.get("maxAttempts")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise InvalidSpec("spec.maxAttempts must be a whole number of at least 1")
    max_in_flight = spec.get("maxInFlight")
    if max_in_flight is not None and (not isinstance(max_in_flight, int) or max_in_flight < 1):
        raise InvalidSpec("spec.maxInFlight must be a whole number of at least 1")
    return TopicSettings(
        topic=topic,
        enabled=bool(spec.get("enabled", True)),
        handler=handler,
        config=config,
        max_attempts=max_attempts,
        timeout=timeout,
        max_in_flight=max_in_flight,
    )


class Outcome:
    """What a reconcile did: the status to patch and, if it changed anything, an event."""

    def __init__(self, status: dict[str, Any], event: str | None, ready: bool) -> None:
        self.status = status
        self.event = event
        self.ready = ready


def _condition(kind: str, reason: str, message: str, now: dt.datetime) -> list[dict[str, Any]]:
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True" if kind == "Ready" else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
    }
    if kind == "Ready":
        return [ready]
    problem = {**ready, "type": kind, "status": "True"}
    return [ready, problem]


def _describe(e: TopicSettings) -> str:
    return (
        f"{e.topic}: {'enabled' if e.enabled else 'paused'}, handler {e.handler or 'built-in'}, "
        f"maxAttempts {e.max_attempts or 'default'}, "
        f"timeout {format_duration(e.timeout) if e.timeout else 'default'}, "
        f"maxInFlight {e.max_in_flight or 'default'}"
    )


def _same(a: TopicSettings, b: TopicSettings) -> bool:
    fields = ("topic", "enabled", "handler", "max_attempts", "timeout", "max_in_flight", "source")
    same = all(getattr(a, f) == getattr(b, f) for f in fields)
    return same and dict(a.config) == dict(b.config)


async def reconcile(
    store: Store[Any],
    spec: Mapping[str, Any],
    *,
    source: str,
    generation: int | None,
    now: dt.datetime,
    lease: dt.timedelta,
    builtin_topics: frozenset[str],
    kinds: Mapping[str, HandlerKind],
) -> Outcome:
    """Make the registry match ``spec``; return the status that says how it went."""
    status: dict[str, Any] = {"observedGeneration": generation}
    try:
        entry = desired(spec, lease=lease, builtin_topics=builtin_topics, kinds=kinds)
    except InvalidSpec as exc:
        status["conditions"] = _condition("Invalid", "InvalidSpec", str(exc), now)
        return Outcome(status, None, ready=False)
    entry = dataclasses.replace(entry, source=source)
    status.update(topic=entry.topic, handler=entry.handler or "built-in", enabled=entry.enabled)
    registry = await store.topics()
    # A resource whose spec.topic changed leaves its old topic behind.
    for old in registry.values():
        if old.source == source and old.topic != entry.topic:
            await store.delete_topic(old.topic)
    current = registry.get(entry.topic)
    holder = current.source if current else None
    if holder and holder.startswith(SOURCE_PREFIX) and holder != source:
        message = (
            f"topic {entry.topic} is already governed by OutboxTopic "
            f"{holder.removeprefix(SOURCE_PREFIX)}; the older resource wins"
        )
        status["conditions"] = _condition("Conflict", "Conflict", message, now)
        return Outcome(status, None, ready=False)
    event = None
    if current is None or not _same(current, entry):
        await store.set_topic(entry, now)
        event = f"registry updated: {_describe(entry)}"
    status["conditions"] = _condition("Ready", "Applied", _describe(entry), now)
    return Outcome(status, event, ready=True)


async def forget(store: Store[Any], source: str) -> list[str]:
    """Remove the registry entries ``source`` wrote; return their topics.

    Removing an entry is not a pause: the topic falls back to its built-in
    handler and the OUTBOX_* defaults (or is buried with "no handler").
    """
    gone = [t.topic for t in (await store.topics()).values() if t.source == source]
    for topic in gone:
        await store.delete_topic(topic)
    return gone


async def backlog(store: Store[Any], topic: str, now: dt.datetime) -> dict[str, Any]:
    """The status fields that show a topic's backlog and how many live relays serve it."""
    stats = {s.topic: s for s in await store.topic_stats()}.get(topic)
    oldest = stats.oldest_pending if stats else None
    relays = sum(topic in r.topics for r in await store.relays())
    return {
        "relays": relays,
        "pending": stats.pending if stats else 0,
        "buried": stats.buried if stats else 0,
        "oldestPendingSeconds": int((now - oldest).total_seconds()) if oldest else 0,
        "oldestPendingAt": oldest.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if oldest
        else None,
    }
