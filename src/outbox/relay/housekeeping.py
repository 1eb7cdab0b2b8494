"""The relay's housekeeping: the topic registry, its row in the fleet, the sweep.

It runs beside claiming, once an interval: a failure there never stops
delivery, but it is said once a cause and makes the relay report not ready,
since a relay the fleet cannot see may have its topics buried as unserved.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable

import anyio

from outbox.clock import Clock
from outbox.errors import StoreUnavailable, first_line
from outbox.relay.config import RelayConfig
from outbox.relay.fleet import Fleet
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Router
from outbox.store import RelayStore

__all__ = ["Housekeeper"]

log = logging.getLogger("outbox.relay")


class Housekeeper:
    """Reads the registry into ``router``, keeps ``fleet``'s registration and sweeps,
    each when due by ``clock``; ``run`` does it every interval until ``stopping()``.

    ``wait(seconds)`` is the relay's wait between rounds (it returns early when
    the relay stops); ``signal()`` tells the relay's waiters that housekeeping ended.
    """

    def __init__(
        self,
        store: RelayStore,
        router: Router,
        fleet: Fleet,
        metrics: RelayMetrics,
        config: RelayConfig,
        *,
        clock: Clock,
        stopping: Callable[[], bool],
        wait: Callable[[float], Awaitable[None]],
        signal: Callable[[], None],
    ) -> None:
        self.store = store
        self.router = router
        self.fleet = fleet
        self.metrics = metrics
        self.config = config
        self.clock = clock
        self._stopping = stopping
        self._wait = wait
        self._signal = signal
        self.failing = True
        """Whether the last registry read, registration or sweep failed (True until
        the first succeeds: a relay the fleet cannot see yet is not ready)."""
        self.done = False
        """Whether run() has ended."""
        self._routes_at: dt.datetime | None = None
        self._beat_at: dt.datetime | None = None
        self._sweep_at: dt.datetime | None = None
        self._rotation_told: str | None = None

    @property
    def routed(self) -> bool:
        """Whether the registry was read at least once (no claim goes before it)."""
        return self._routes_at is not None

    async def once(self, *, force: bool = False) -> None:
        """Read the registry, refresh this relay's registration and sweep, as each is due."""
        now = self.clock()
        if force or self._routes_at is None or now >= self._routes_at:
            await self.refresh_topics()
        if force or self._beat_at is None or now >= self._beat_at:
            await self.fleet.heartbeat()
            self._beat_at = now + self.config.interval
        if force or self._sweep_at is None or now >= self._sweep_at:
            await self.fleet.sweep()
            self._sweep_at = now + self.fleet.sweep_every
        await self.rotate()

    async def rotate(self) -> None:
        """Empty what the store no longer fills (outbox.postgres.ring). A failure
        here never makes the relay unready (delivery goes on; the space waits):
        it is said once a cause, and again once it works."""
        try:
            await self.store.rotate()
        except StoreUnavailable:
            raise
        except Exception as exc:
            said = first_line(exc)
            if said != self._rotation_told:
                self._rotation_told = said
                log.warning(
                    "could not empty the outbox's storage: %s; delivery goes on, and "
                    "the space of settled messages is returned once this works",
                    said,
                )
        else:
            if self._rotation_told is not None:
                log.info("the outbox's storage is emptied again")
            self._rotation_told = None

    async def refresh_topics(self) -> None:
        """Read the topic registry now (once() does it at most once an interval)."""
        entries = await self.store.topics()
        self.router.update(entries)
        self._routes_at = self.clock() + self.config.interval
        # Labels are the topics this relay serves or the registry names; what
        # producers invent beyond them counts under one label.
        self.metrics.label_topics(self.router.served | entries.keys())

    async def run(self, scope: anyio.CancelScope) -> None:
        """Registry, registration and sweep, every interval, apart from claiming."""
        with scope:
            try:
                await self._until_stopped()
            finally:
                self.done = True
                self._signal()

    async def _until_stopped(self) -> None:
        interval = self.config.interval.total_seconds()
        told: str | None = None
        while not self._stopping():
            try:
                await self.once()
            except Exception as exc:
                self.failing = True
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
                if self.failing and told is not None:
                    log.info("housekeeping works again")
                self.failing = False
                told = None
            await self._wait(interval)
