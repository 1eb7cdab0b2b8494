"""Backlog gauges: pending and buried messages and the oldest pending age, by topic.

Counters say what happened; these say what is waiting, so an alert on buried
messages keeps firing until someone acts, and a stale backlog shows. Each
relay refreshes them every OUTBOX_BACKLOG_INTERVAL; one relay at a time counts
(a grouped query over the whole table) and the others read its count.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from outbox.relay import Clock, system_clock
from outbox.relay.metrics import BacklogMetrics
from outbox.store import Store

__all__ = ["Backlog"]

log = logging.getLogger("outbox.service.backlog")


class Backlog:
    """Keeps the backlog gauges of ``registry`` in step with ``store``."""

    def __init__(
        self,
        store: Store[Any],
        *,
        clock: Clock = system_clock,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.gauges = BacklogMetrics.of(registry)
        self._seen: set[str] = set()

    async def refresh(self, max_age: dt.timedelta | None = None) -> None:
        """Query the store once and set every gauge; topics now empty go to 0.

        With ``max_age``, another relay's count of at most that age will do.
        """
        stats = await self.store.topic_stats(max_age=max_age)
        now = self.clock()
        current = set()
        for s in stats:
            current.add(s.topic)
            self.gauges.buried.labels(s.topic).set(s.buried)
            self.gauges.pending.labels(s.topic).set(s.pending)
            age = 0.0 if s.oldest_pending is None else (now - s.oldest_pending).total_seconds()
            self.gauges.oldest.labels(s.topic).set(max(age, 0.0))
        for topic in self._seen - current:
            for gauge in (self.gauges.buried, self.gauges.pending, self.gauges.oldest):
                gauge.labels(topic).set(0)
        self._seen |= current

    async def run(self, every: dt.timedelta) -> None:
        """Refresh every ``every`` until cancelled; a failing store is logged, not fatal."""
        while True:
            try:
                await self.refresh(every)
            except Exception as exc:
                log.warning("backlog refresh failed: %s", exc)
            await anyio.sleep(every.total_seconds())
