"""The relay's housekeeping: the topic registry, its row in the fleet, the sweep.

It runs beside claiming, once an interval: a failure there never stops
delivery, but it is said once a cause and makes the relay report not ready,
since a relay the fleet cannot see may have its topics buried as unserved.
"""

from __future__ import annotations

import datetime as dt
import logging

import anyio

from outbox.clock import Clock
from outbox.errors import StoreUnavailable, first_line
from outbox.relay.config import RelayConfig
from outbox.relay.fleet import Fleet
from outbox.relay.inflight import InFlight
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Router
from outbox.store import RelayStore

__all__ = ["Housekeeping"]

log = logging.getLogger("outbox.relay")


class Housekeeping:
    """The housekeeping half of Relay (outbox.relay.core), which sets these up."""

    store: RelayStore
    config: RelayConfig
    router: Router
    metrics: RelayMetrics
    fleet: Fleet
    _held: InFlight
    housekeeping_failing: bool
    _routes_at: dt.datetime | None
    _beat_at: dt.datetime | None
    _sweep_at: dt.datetime | None
    _stopping: bool
    _housekeeping_done: bool
    _local: Clock

    async def _sleep(self, seconds: float, slack: float | None = None) -> None:
        raise NotImplementedError

    async def housekeep(self, *, force: bool = False) -> None:
        """Read the registry, refresh this relay's registration and sweep, as each is due."""
        now = self._local()
        if force or self._routes_at is None or now >= self._routes_at:
            await self.refresh_topics()
        if force or self._beat_at is None or now >= self._beat_at:
            await self.fleet.heartbeat()
            self._beat_at = now + self.config.interval
        if force or self._sweep_at is None or now >= self._sweep_at:
            await self.fleet.sweep()
            self._sweep_at = now + self.fleet.sweep_every

    async def refresh_topics(self) -> None:
        """Read the topic registry now (housekeeping does it at most once an interval)."""
        entries = await self.store.topics()
        self.router.update(entries)
        self._routes_at = self._local() + self.config.interval
        # Labels are the topics this relay serves or the registry names; what
        # producers invent beyond them counts under one label.
        self.metrics.label_topics(self.router.served | entries.keys())

    async def _housekeeping(self, scope: anyio.CancelScope) -> None:
        """Registry, registration and sweep, every interval, apart from claiming."""
        with scope:
            try:
                await self._housekeep_until_stopped()
            finally:
                self._housekeeping_done = True
                self._held.signal()

    async def _housekeep_until_stopped(self) -> None:
        interval = self.config.interval.total_seconds()
        told: str | None = None
        while not self._stopping:
            try:
                await self.housekeep()
            except Exception as exc:
                self.housekeeping_failing = True
                if isinstance(exc, StoreUnavailable):
                    self.metrics.database_up.set(0)
                    log.debug("housekeeping failed: %s", exc)  # the feeder says it once
                else:
                    # Said once a cause (a missing grant fails every interval).
                    said = first_line(exc)
                    if said != told:
                        told = said
                        log.error(
                            "housekeeping failed: %s; this relay is not registered in the "
                            "fleet and reports not ready until it works again",
                            said,
                        )
                    else:
                        log.debug("housekeeping failed again: %s", said)
            else:
                if self.housekeeping_failing and told is not None:
                    log.info("housekeeping works again")
                self.housekeeping_failing = False
                told = None
            await self._sleep(interval)
