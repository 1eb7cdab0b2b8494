"""What the console does, for its JSON API and its pages alike: the same store
operations ``outbox buried``, ``outbox topics`` and ``outbox keys`` run.

Every change and every payload reveal writes one audit line (who, role,
action, topic, the filter's field names, count: never a payload, a key or the
error text searched for) and counts in ``outbox_ui_actions_total{action}``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from outbox.records import RelayInfo, TopicStats
from outbox.service.ui.tokens import Identity
from outbox.store import BuriedCount, BuriedFilter, Store, StoredMessage, TopicSettings

__all__ = ["STALE", "Governed", "Operations", "Overview", "TopicRow"]

audit = logging.getLogger("outbox.ui.audit")

STALE = dt.timedelta(minutes=2)
"""A backlog measurement older than this is shown as stale (no relay is measuring)."""
SHARED_FOR = dt.timedelta(seconds=1)
"""How long one read of the overview and of the relays answers every visitor:
an incident's crowd on the overview costs the database one read a second."""
GRANTS_AGE = dt.timedelta(minutes=1)
"""How long the console believes what it read of its database role's grants."""
COUNT_AGE = dt.timedelta(minutes=1)
"""A direct count shares a measurement younger than this instead of counting again."""


class Governed(Exception):
    """A topic an OutboxTopic governs: changing it here needs an explicit override."""

    def __init__(self, topic: str, source: str, enabled: bool) -> None:
        namespace, _, name = source.removeprefix("kubernetes:").partition("/")
        action = "resume" if enabled else "pause"
        patch = json.dumps({"spec": {"enabled": enabled}})
        self.command = f"kubectl -n {namespace} patch outboxtopic {name} --type merge -p '{patch}'"
        super().__init__(
            f"{topic} is governed by OutboxTopic {namespace}/{name}: {action} it there, "
            f"`{self.command}`, or force an operator's override (?force=1; outbox topics "
            "delete releases it)"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRow:
    """A topic as the overview shows it."""

    topic: str
    stats: TopicStats | None
    entry: TopicSettings | None
    relays: int

    @property
    def paused(self) -> bool:
        return self.entry is not None and not self.entry.enabled

    @property
    def override(self) -> bool:
        """An operator's entry over a topic an OutboxTopic governed (released by
        ``outbox topics delete``)."""
        return self.entry is not None and self.entry.source == "cli"

    def oldest_seconds(self, now: dt.datetime) -> float | None:
        oldest = self.stats.oldest_pending if self.stats else None
        return None if oldest is None else max((now - oldest).total_seconds(), 0.0)

    def record(self, now: dt.datetime) -> dict[str, Any]:
        s = self.stats
        return {
            "topic": self.topic,
            "pending": s.pending if s else 0,
            "in_flight": (s.in_flight or 0) if s else 0,
            "due_later": s.due_later if s else None,
            "buried": s.buried if s else 0,
            "blocked_keys": (s.blocked_keys or 0) if s else 0,
            "oldest_pending_seconds": self.oldest_seconds(now),
            "paused": self.paused,
            "handler": self.entry.handler if self.entry else None,
            "relays": self.relays,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    """Every topic's counts and when they were measured."""

    topics: list[TopicRow]
    measured_at: dt.datetime | None
    now: dt.datetime

    @property
    def stale(self) -> bool:
        return self.measured_at is None or self.now - self.measured_at > STALE


class Operations:
    """The console's operations over ``store``."""

    def __init__(
        self,
        store: Store[Any],
        registry: CollectorRegistry,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.store = store
        self.clock = clock
        self._writable: tuple[dt.datetime, bool] | None = None
        self._overview: tuple[dt.datetime, Overview] | None = None
        self._relays: tuple[dt.datetime, list[RelayInfo]] | None = None
        self.actions = Counter(
            "outbox_ui_actions",
            "Changes and payload reveals made through the console, by action.",
            ["action"],
            registry=registry,
        )

    # -- reads --------------------------------------------------------------------------

    async def writable(self) -> bool:
        """Whether the console's database role may change anything (read again
        after GRANTS_AGE: a grant given later shows without a restart)."""
        now = self.clock()
        if self._writable is None or now - self._writable[0] > GRANTS_AGE:
            self._writable = (now, await self.store.may_change())
        return self._writable[1]

    async def overview(self, *, count: bool = False, when_missing: bool = False) -> Overview:
        """The relays' last shared measurement, never a count of its own, unless
        ``count`` (or ``when_missing`` and there is none): then one bounded
        count, shared with the relays as theirs are. No measurement and no
        count: the topics of the registry, without counts. Read at most once a
        SHARED_FOR for every visitor (a change made here reads it again)."""
        now = self.clock()
        cached = self._overview
        if (
            cached is not None
            and not count
            and now - cached[0] < SHARED_FOR
            and (cached[1].measured_at is not None or not when_missing)
        ):
            return cached[1]
        overview = await self._read_overview(count=count, when_missing=when_missing)
        self._overview = (now, overview)
        return overview

    async def _read_overview(self, *, count: bool, when_missing: bool) -> Overview:
        measured = None if count else await self.store.backlog_measurement()
        at: dt.datetime | None = None
        stats: list[TopicStats] = []
        if measured is not None:
            at, stats = measured
        elif count or when_missing:
            stats = await self.store.topic_stats(max_age=COUNT_AGE)
            at = self.clock()
        registry = await self.store.topics()
        serving: dict[str, int] = {}
        everything = 0
        for relay in await self.relays():
            if not relay.topics:
                everything += 1
            for t in relay.topics:
                serving[t] = serving.get(t, 0) + 1
        by_topic = {s.topic: s for s in stats}
        rows = [
            TopicRow(t, by_topic.get(t), registry.get(t), serving.get(t, 0) + everything)
            for t in sorted(by_topic.keys() | registry.keys())
        ]
        return Overview(rows, at, self.clock())

    async def relays(self) -> list[RelayInfo]:
        """The live relays, read at most once a SHARED_FOR."""
        now = self.clock()
        if self._relays is None or now - self._relays[0] >= SHARED_FOR:
            self._relays = (now, await self.store.relays())
        return self._relays[1]

    async def reveal(self, identity: Identity, message_id: uuid.UUID) -> StoredMessage:
        """A message with its payload, for an operator; audit-logged."""
        stored = await self.store.get(message_id)
        self._audit(identity, "reveal", stored.message.topic, f"message={stored.message.id}")
        return stored

    # -- changes ------------------------------------------------------------------------

    async def count_buried(self, selection: BuriedFilter) -> BuriedCount:
        return await self.store.count_buried(selection)

    async def act_on_buried(
        self, identity: Identity, action: str, selection: BuriedFilter, named: list[str]
    ) -> int:
        """Requeue or purge what ``selection`` selects, limited to what was
        buried by the time of a count taken first (a dry run's ``buried_by``,
        when it gave one, is kept: the action can only act on fewer)."""
        found = await self.store.count_buried(selection)
        done = 0
        if found.as_of is not None:
            by = (
                found.as_of
                if selection.buried_by is None
                else min(selection.buried_by, found.as_of)
            )
            acting = dataclasses.replace(selection, buried_by=by)
            if action == "requeue":
                done = await self.store.requeue(selection=acting)
            else:
                done = await self.store.purge_buried(selection=acting)
        fields = ",".join(named) or "all"
        self._audit(identity, action, selection.topic or "*", f"filter={fields} count={done}")
        return done

    async def enable(self, identity: Identity, topic: str, *, enabled: bool, force: bool) -> bool:
        """Pause or resume ``topic``, as ``outbox topics pause|resume`` does; a
        topic an OutboxTopic governs raises Governed unless ``force``, which
        writes an operator's override. Whether it overrode a resource."""
        current = (await self.store.topics()).get(topic) or TopicSettings(topic)
        source = current.source or ""
        governed = source.startswith("kubernetes:")
        if governed and not force:
            raise Governed(topic, source, enabled)
        entry = dataclasses.replace(current, enabled=enabled, source="cli", reroute=True)
        await self.store.set_topic(entry)
        self._overview = None
        action = "resume" if enabled else "pause"
        self._audit(identity, action, topic, "(an override of its OutboxTopic)" if governed else "")
        return governed

    async def release(self, identity: Identity, topic: str) -> bool:
        """Remove an operator's entry (``outbox topics delete``): an OutboxTopic
        that governed the topic writes its own again."""
        removed = await self.store.delete_topic(topic)
        self._overview = None
        self._audit(identity, "release", topic, "")
        return removed

    def _audit(self, identity: Identity, action: str, topic: str, rest: str) -> None:
        self.actions.labels(action).inc()
        audit.info(
            "%s (%s) %s: topic=%s%s",
            identity.name,
            identity.role.value,
            action,
            topic,
            f" {rest}" if rest else "",
        )
