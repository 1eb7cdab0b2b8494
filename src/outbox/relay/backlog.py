"""Backlog gauges: pending and buried messages and the oldest pending age, by topic;
and the storage's: its size, its dead rows, and the oldest snapshot holding it back.

Counters say what happened; these say what is waiting, so an alert on buried
messages keeps firing until someone acts, and a stale backlog shows. Each
relay refreshes them (``Relay(..., backlog=...)``, OUTBOX_BACKLOG_INTERVAL) beside
its loop; one relay at a time counts (a grouped query over the whole table)
and the others read its count.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from outbox.clock import Clock, system_clock
from outbox.relay.metrics import MAX_TOPIC_LABELS, OTHER, BacklogMetrics
from outbox.store import Operator

__all__ = ["BLOCKED_KEYS", "Backlog"]

BLOCKED_KEYS = 10_000
"""Most blocked keys one refresh counts (outbox keys blocked lists them all)."""
HELD_TRANSACTIONS = 10_000
"""A snapshot this many transactions behind is held, whatever its age (Backlog.held)."""
RELEASED_DEAD_ROWS = 100_000
"""Once a snapshot is released, claims read from the first again when the outbox's
dead rows are down to this many, or twice as many as when it began to be held."""

log = logging.getLogger("outbox.relay.backlog")


class Backlog:
    """Keeps the backlog gauges of ``registry`` in step with ``store``.

    ``label`` maps a topic to its label (a relay's: what it serves or the
    registry names, the rest OTHER); without it, the first MAX_TOPIC_LABELS
    topics by name are labels. Either way the series stay bounded whatever
    topics producers invent: OTHER sums their counts and keeps their oldest.
    """

    def __init__(
        self,
        store: Operator,
        *,
        clock: Clock = system_clock,
        registry: CollectorRegistry | None = None,
        label: Callable[[str], str] | None = None,
        held_after: dt.timedelta = dt.timedelta(seconds=30),
    ) -> None:
        self.store = store
        self.held_after = held_after
        """A snapshot this old, or HELD_TRANSACTIONS behind, is held: what is
        deleted meanwhile stays in the indexes."""
        self.clock = clock
        self.gauges = BacklogMetrics.of(registry)
        self.label = label
        self._seen: set[str] = set()
        self.held = False
        """Whether the last refresh found a snapshot held (``held_after``), or found
        what one kept not vacuumed yet."""
        self._dead_before = 0

    async def refresh(self, max_age: dt.timedelta | None = None) -> None:
        """Query the store once and set every gauge; topics now empty go to 0.

        With ``max_age``, another relay's count of at most that age will do.
        Series of topics that are gone and no longer labels are removed.
        """
        stats = await self.store.topic_stats(max_age=max_age)
        blocked: list[tuple[str, int, dt.datetime | None]] = [
            (s.topic, s.blocked_keys or 0, s.oldest_blocked) for s in stats
        ]
        if any(s.blocked_keys is None for s in stats):  # an older relay's measurement
            found = await self.store.keys_blocked(limit=BLOCKED_KEYS)
            blocked = [(b.topic, 1, b.since) for b in found]
        now = self.clock()
        label = self.label or _first({s.topic for s in stats} | self._seen)
        totals: dict[str, list[float]] = {}
        for s in stats:
            entry = totals.setdefault(label(s.topic), [0, 0, 0.0, 0, 0.0])
            entry[0] += s.buried
            entry[1] += s.pending
            if s.oldest_pending is not None:
                entry[2] = max(entry[2], (now - s.oldest_pending).total_seconds())
        for topic, keys, since in blocked:
            entry = totals.setdefault(label(topic), [0, 0, 0.0, 0, 0.0])
            entry[3] += keys
            if since is not None:
                entry[4] = max(entry[4], (now - since).total_seconds())
        g = self.gauges
        gauges = (g.buried, g.pending, g.oldest, g.blocked, g.oldest_blocked)
        for name, values in totals.items():
            for gauge, value in zip(gauges, values, strict=True):
                gauge.labels(name).set(max(value, 0.0))
        for name in self._seen - totals.keys():
            for gauge in gauges:
                if label(name) == name:
                    gauge.labels(name).set(0)
                else:
                    gauge.remove(name)
        self._seen = {n for n in self._seen | totals.keys() if n in totals or label(n) == n}
        health = await self.store.storage()  # catalog views: every relay reads its own
        g.snapshot_age.set(health.oldest_snapshot_seconds)
        g.snapshot_transactions.set(health.oldest_snapshot_transactions)
        g.dead_rows.set(health.dead_rows)
        g.storage_bytes.set(health.size_bytes)
        held = (
            health.oldest_snapshot_seconds >= self.held_after.total_seconds()
            or health.oldest_snapshot_transactions >= HELD_TRANSACTIONS
        )
        if held and not self.held:
            self._dead_before = health.dead_rows
        # Released, what the snapshot kept is dead to all but not yet vacuumed:
        # a claim from the first would visit each entry once more. Claims read
        # on from the watermark until vacuum has removed most of it.
        vacuumed = health.dead_rows <= max(2 * self._dead_before, RELEASED_DEAD_ROWS)
        held = held or (self.held and not vacuumed)
        if held and not self.held:
            log.warning(
                "a snapshot held for %.0fs (%d transactions) keeps the outbox from being "
                "vacuumed: claims read on from where the last ones stopped",
                health.oldest_snapshot_seconds,
                health.oldest_snapshot_transactions,
            )
        elif self.held and not held:
            log.warning(
                "no snapshot holds the outbox back any more, and what one kept is "
                "vacuumed: claims read from the first"
            )
        self.held = held

    async def run(self, every: dt.timedelta) -> None:
        """Refresh every ``every`` until cancelled; a failing store is logged, not fatal."""
        told = None
        while True:
            try:
                await self.refresh(every)
                told = None
            except Exception as exc:
                if str(exc) != told:  # once a cause, not once an interval
                    told = str(exc)
                    log.warning("backlog refresh failed: %s", exc)
            await anyio.sleep(every.total_seconds())


def _first(topics: Any) -> Callable[[str], str]:
    keep = frozenset(sorted(topics)[:MAX_TOPIC_LABELS])
    return lambda topic: topic if topic in keep else OTHER
