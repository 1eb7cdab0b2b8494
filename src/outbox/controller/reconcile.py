"""What the controller does, as plain functions: OutboxTopic spec -> registry row + status.

Reconciling is level-based: it compares the registry with the spec and writes
what differs, so running it again (a watch replay, the status timer) is
harmless. Two resources that name the same topic conflict; the older one
(creation time, then namespace/name) governs it, whatever order they are
seen in, decided by the store in one statement; the other reports a Conflict
condition until the holder is gone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from outbox.controller.grants import NO_GRANTS, Grants
from outbox.durations import format_duration, parse_duration
from outbox.errors import OutboxError
from outbox.handler import HandlerKind, Kind
from outbox.handlers import KINDS
from outbox.handlers.registry import EntryError, check_entry
from outbox.message import validate_topic
from outbox.store import Operator, Registry, Store, TopicSettings

__all__ = [
    "InvalidSpec",
    "Outcome",
    "backlog",
    "conditions",
    "desired",
    "forget",
    "prune",
    "reconcile",
    "source_of",
    "unavailable",
]

SOURCE_PREFIX = "kubernetes:"


class InvalidSpec(OutboxError):
    """The OutboxTopic's spec cannot be applied; the message says why."""


class Ungranted(InvalidSpec):
    """The resource's namespace may not govern its topic as it asks: the entry it
    wrote before, if any, leaves the registry."""


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
    config = _handler_config(spec, handler)
    timeout = None
    if spec.get("timeout") is not None:
        try:
            timeout = parse_duration(str(spec["timeout"]))
        except ValueError as exc:
            raise InvalidSpec(f"spec.timeout: {exc}") from None
    entry = TopicSettings(
        topic=topic,
        enabled=bool(spec.get("enabled", True)),
        handler=handler,
        config=config,
        max_attempts=spec.get("maxAttempts"),
        timeout=timeout,
        max_in_flight=spec.get("maxInFlight"),
        on_buried=_on_buried(spec),
    )
    try:
        check_entry(entry, lease=lease, builtin_topics=builtin_topics, kinds=kinds)
    except EntryError as exc:
        raise InvalidSpec(f"spec.{exc.field} {exc.reason}") from None
    return entry


def _on_buried(spec: Mapping[str, Any]) -> str | None:
    """spec.ordering.onBuried; block (the default) is stored as None."""
    ordering = spec.get("ordering") or {}
    if not isinstance(ordering, Mapping):
        raise InvalidSpec("spec.ordering must be an object")
    value = ordering.get("onBuried", "block")
    if value not in ("block", "skip"):
        raise InvalidSpec(f"spec.ordering.onBuried is block or skip, not {value!r}")
    return None if value == "block" else str(value)


def _handler_config(spec: Mapping[str, Any], handler: str | None) -> dict[str, Any]:
    """The registry config of ``spec``: its kind's field (spec.webhook, spec.nats...)
    in the relays' spelling (Kind.spec_names).

    spec.config (deprecated) is taken as it is, already in that spelling.
    """
    for other in KINDS:
        if other.spec_field and spec.get(other.spec_field) is not None and handler != other.name:
            raise InvalidSpec(
                f"spec.{other.spec_field} goes with handler {other.name}, "
                f"not {handler or 'built-in'}"
            )
    legacy = spec.get("config") or {}
    if not isinstance(legacy, dict):
        raise InvalidSpec("spec.config must be an object")
    kind = next((k for k in KINDS if k.name == handler and k.spec_field), None)
    shared = _topic_fields(spec, kind)
    typed = None if kind is None or kind.spec_field is None else spec.get(kind.spec_field)
    if kind is None or typed is None:
        return {**legacy, **shared}
    if not isinstance(typed, dict):
        raise InvalidSpec(f"spec.{kind.spec_field} must be an object")
    return {**kind.config_of(typed), **shared}


def _topic_fields(spec: Mapping[str, Any], kind: Kind | None) -> dict[str, Any]:
    """The spec's top-level fields ``kind`` takes into its config (spec.cloudEvents),
    or InvalidSpec for one set on a kind that has no such field."""
    taken: dict[str, Any] = {}
    for other in KINDS:
        for name in other.topic_fields:
            value = spec.get(name)
            if value in (None, False) or name in taken:
                continue
            if kind is None or name not in kind.topic_fields:
                users = ", ".join(k.name for k in KINDS if name in k.topic_fields)
                raise InvalidSpec(f"spec.{name} goes with handler {users}")
            taken[name] = value
    return {kind.topic_fields[name]: value for name, value in taken.items()} if kind else {}


class Outcome:
    """What a reconcile did: the status to patch, an event if it changed the registry,
    and a warning if its problem is new (not one already reported)."""

    def __init__(
        self, status: dict[str, Any], event: str | None, ready: bool, warning: str | None = None
    ) -> None:
        self.status = status
        self.event = event
        self.ready = ready
        self.warning = warning


def conditions(
    kind: str,
    reason: str,
    message: str,
    now: dt.datetime,
    previous: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Ready (and, unless it is Ready, the problem's own condition) for ``kind``.

    ``kind`` is Ready, Invalid, Conflict or Unknown (the state cannot be read).
    A condition whose status is what it was keeps its lastTransitionTime.
    """
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"Ready": "True", "Unknown": "Unknown"}.get(kind, "False")
    made = [{"type": "Ready", "status": status, "reason": reason, "message": message}]
    if kind not in ("Ready", "Unknown"):
        made.append({"type": kind, "status": "True", "reason": reason, "message": message})
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    for c in made:
        old = before.get(c["type"]) or {}
        same = old.get("status") == c["status"]
        c["lastTransitionTime"] = old.get("lastTransitionTime", stamp) if same else stamp
    return made


def new_problem(status: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str | None:
    """The message of ``status``'s problem when ``previous`` did not report the same one."""
    [ready, *problem] = status["conditions"]
    if not problem and ready["status"] != "Unknown":
        return None
    now = (ready["status"], ready["reason"], ready["message"])
    old = next(
        (c for c in (previous or {}).get("conditions") or [] if c.get("type") == "Ready"), None
    )
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == now:
        return None
    message: str = ready["message"]
    return message


def _describe(e: TopicSettings) -> str:
    return (
        f"{e.topic}: {'enabled' if e.enabled else 'paused'}, handler {e.handler or 'built-in'}, "
        f"maxAttempts {e.max_attempts or 'default'}, "
        f"timeout {format_duration(e.timeout) if e.timeout else 'default'}, "
        f"maxInFlight {e.max_in_flight or 'default'}"
        + (", onBuried skip" if e.on_buried == "skip" else "")
    )


def _same(a: TopicSettings, b: TopicSettings) -> bool:
    fields = (
        "topic", "enabled", "handler", "max_attempts", "timeout", "max_in_flight", "source",
        "on_buried", "reroute",
    )  # fmt: skip
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
    created: dt.datetime | None = None,
    previous: Mapping[str, Any] | None = None,
    grants: Grants = NO_GRANTS,
) -> Outcome:
    """Make the registry match ``spec``; return the status that says how it went.

    ``created`` is the resource's creation time: of two resources for one topic
    the older governs it (ties: the lower namespace/name), decided by the store
    in one statement. ``previous`` is the status as it stands, so conditions
    keep their transition times and a problem is reported once, not per tick.
    ``grants`` says which namespaces may govern which topics (see grants.py).
    """
    status: dict[str, Any] = {"observedGeneration": generation}
    registry = await store.topics()
    try:
        entry = desired(spec, lease=lease, builtin_topics=builtin_topics, kinds=kinds)
        reroute = await _granted(store, entry, source, registry, grants, builtin_topics, kinds)
    except InvalidSpec as exc:
        applied = registry.get(str(spec.get("topic")))
        if isinstance(exc, Ungranted) and applied is not None and applied.source == source:
            # Applied while nothing showed the topic had a handler of its own
            # (a fresh install, a relay outage): relays with one never used
            # it, and now no relay does.
            await store.delete_topic(applied.topic)
            applied = None
        status["enabled"] = applied.enabled if applied else True
        status["conditions"] = conditions("Invalid", "InvalidSpec", str(exc), now, previous)
        return Outcome(status, None, ready=False, warning=new_problem(status, previous))
    entry = dataclasses.replace(entry, source=source, owner_since=created, reroute=reroute)
    status.update(topic=entry.topic, handler=entry.handler or "built-in")
    # A resource whose spec.topic changed (before it was immutable) leaves its old topic.
    for old in registry.values():
        if old.source == source and old.topic != entry.topic:
            await store.delete_topic(old.topic)
    current = registry.get(entry.topic)
    holder = await store.govern_topic(entry, now)
    if holder != source:
        if holder is not None and not holder.startswith(SOURCE_PREFIX):
            message = (
                f"topic {entry.topic} has an entry written by `outbox topics` ({holder}); "
                f"an operator removes it (outbox topics delete {entry.topic}) for this "
                "resource to govern the topic"
            )
        else:
            message = (
                f"topic {entry.topic} is already governed by OutboxTopic "
                f"{(holder or '?').removeprefix(SOURCE_PREFIX)}, which is older"
            )
        status["enabled"] = current.enabled if current else True
        status["conditions"] = conditions("Conflict", "Conflict", message, now, previous)
        return Outcome(status, None, ready=False, warning=new_problem(status, previous))
    status["enabled"] = entry.enabled
    event = None
    if current is None or not _same(current, entry):
        event = f"registry updated: {_describe(entry)}"
    status["conditions"] = conditions("Ready", "Applied", _describe(entry), now, previous)
    return Outcome(status, event, ready=True)


async def _granted(
    store: Operator,
    entry: TopicSettings,
    source: str,
    registry: Mapping[str, TopicSettings],
    grants: Grants,
    builtin_topics: frozenset[str],
    kinds: Mapping[str, HandlerKind],
) -> bool:
    """Raise Ungranted unless the resource's namespace may govern ``entry`` as it
    asks; return whether it holds a reroute grant (its entry's ``reroute``)."""
    namespace = source.removeprefix(SOURCE_PREFIX).partition("/")[0]
    found = grants.find(namespace, entry.topic)
    if grants.configured and not found:
        raise Ungranted(
            f"namespace {namespace} is not granted topic {entry.topic} "
            "(OUTBOX_CONTROLLER_GRANTS; chart value controller.grants)"
        )
    reroute = any(g.reroute for g in found)
    if entry.handler not in kinds or reroute:
        return reroute
    # Rerouting: has the topic a built-in or an application handler? Relays
    # list the topics they have one for; a relay of an earlier release lists
    # only what it serves, where a topic a kind serves through the registry
    # is listed too, so those entries do not count.
    by_kind = {t for t, e in registry.items() if e.handler in kinds}
    relays = await store.relays()
    served = {t for r in relays for t in r.topics} - by_kind
    served.update(t for r in relays for t in r.handlers)
    if entry.topic in builtin_topics or entry.topic in served:
        raise Ungranted(
            f"topic {entry.topic} has a built-in or application handler; sending it to "
            f"handler {entry.handler} needs a grant with :reroute for namespace {namespace} "
            "(OUTBOX_CONTROLLER_GRANTS; chart value controller.grants)"
        )
    return False


def unavailable(reason: str, now: dt.datetime, previous: Mapping[str, Any] | None) -> Outcome:
    """The status while the registry cannot be read: Ready Unknown, numbers left as they were."""
    status = {
        "conditions": conditions(
            "Unknown",
            "DatabaseUnavailable",
            f"cannot read the topic registry: {reason}; pending, buried and relays are stale",
            now,
            previous,
        )
    }
    return Outcome(status, None, ready=False, warning=new_problem(status, previous))


async def forget(store: Registry, source: str) -> list[str]:
    """Remove the registry entries ``source`` wrote; return their topics.

    Removing an entry is not a pause: the topic falls back to its built-in
    handler and the OUTBOX_* defaults (or is buried with "no handler").
    """
    gone = [t.topic for t in (await store.topics()).values() if t.source == source]
    for topic in gone:
        await store.delete_topic(topic)
    return gone


async def prune(store: Registry, existing: set[str], *, namespaces: list[str] | None) -> list[str]:
    """Remove entries of OutboxTopics that no longer exist; return their topics.

    ``existing`` are the sources of every resource the controller sees; only
    entries of the watched ``namespaces`` (None: all) are considered, so one
    release's controller never prunes another's.
    """
    gone = []
    for t in (await store.topics()).values():
        source = t.source or ""
        if not source.startswith(SOURCE_PREFIX) or source in existing:
            continue
        namespace = source.removeprefix(SOURCE_PREFIX).partition("/")[0]
        if namespaces is None or namespace in namespaces:
            await store.delete_topic(t.topic)
            gone.append(t.topic)
    return gone


async def backlog(
    store: Operator, topic: str, now: dt.datetime, max_age: dt.timedelta | None = None
) -> dict[str, Any]:
    """The status fields that show a topic's backlog and how many live relays serve it.

    With ``max_age``, a relay's backlog count of at most that age will do.
    """
    # Its grant reads no key column: blocked keys come from a relay's measurement.
    stats = {s.topic: s for s in await store.topic_stats(max_age=max_age, blocked=False)}.get(topic)
    oldest = stats.oldest_pending if stats else None
    relays = sum(topic in r.topics for r in await store.relays())
    return {
        "relays": relays,
        "pending": stats.pending if stats else 0,
        "buried": stats.buried if stats else 0,
        # None (unknown: no relay measured lately) removes the field.
        "blockedKeys": (stats.blocked_keys if stats else 0),
        "oldestPendingSeconds": int((now - oldest).total_seconds()) if oldest else 0,
        "oldestPendingAt": oldest.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if oldest
        else None,
    }
