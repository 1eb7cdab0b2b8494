"""The relay in its fleet: its row in outbox_relays, its clock skew, the unserved sweep.

Every relay registers what it can deliver and refreshes that every interval;
a relay that stops refreshing (it died or stalled) stops counting once its
row expires. A topic no live relay serves is not buried at once: during a
rolling deploy the old relay lacks a handler the new one has. Only once no
live relay has served the topic for OUTBOX_UNSERVED_GRACE does a sweep (one
relay at a time) bury its due messages with "no handler", as the design says.
A topic with a registry entry (paused, or bound to a handler some relays
lack) is never buried for it: its relays are expected.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import logging
import os
import socket
import time
import uuid

from outbox.clock import Clock
from outbox.durations import format_duration
from outbox.relay.config import RelayConfig
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Router
from outbox.store import RelayInfo, RelayStore

__all__ = ["Fleet", "version"]

log = logging.getLogger("outbox.relay")

_SKEW_WARNING = 1.0
_MIN_TTL = dt.timedelta(seconds=30)
_MAX_SWEEP_EVERY = dt.timedelta(seconds=30)


def version() -> str:
    """The installed outbox-relay version."""
    try:
        return importlib.metadata.version("outbox-relay")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Fleet:
    """One relay's membership: register, measure skew, sweep unserved topics, leave."""

    def __init__(
        self,
        store: RelayStore,
        router: Router,
        config: RelayConfig,
        metrics: RelayMetrics,
        *,
        clock: Clock | None,
        host: str | None = None,
    ) -> None:
        self.store = store
        self.router = router
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.id = uuid.uuid4()
        self.host = host or socket.gethostname()
        """How `outbox relays` names this relay: the pod's name in Kubernetes."""
        self.version = version()
        self.ttl = max(10 * config.interval, _MIN_TTL)
        """How long one heartbeat keeps this relay live."""
        self.sweep_every = max(min(config.unserved_grace / 4, _MAX_SWEEP_EVERY), config.interval)
        self.skew: float | None = None
        self._skew_told = False

    def info(self) -> RelayInfo:
        return RelayInfo(
            id=self.id,
            host=self.host,
            pid=os.getpid(),
            version=self.version,
            topics=tuple(sorted(self.router.served)),
            kinds=tuple(sorted(self.router.kinds)),
            handlers=tuple(sorted(self.router.handlers)),
        )

    async def heartbeat(self) -> None:
        """Register (or refresh) this relay; measure its clock against the store's."""
        now = self.clock() if self.clock else None
        sent = time.time()
        db_now = await self.store.register_relay(self.info(), self.ttl, now=now)
        if self.clock is not None:
            return  # an injected clock is the store's time: no skew to speak of
        skew = (sent + time.time()) / 2 - db_now.timestamp()
        self.skew = skew
        self.metrics.clock_skew.set(skew)
        if abs(skew) > _SKEW_WARNING and not self._skew_told:
            self._skew_told = True
            log.warning(
                "this relay's clock is %.1fs %s the database's; leases and retries use "
                "the database's time, but fix the clock (NTP)",
                abs(skew),
                "ahead of" if skew > 0 else "behind",
            )

    async def sweep(self) -> int:
        """Bury due messages of topics nobody has served for the grace; return how many.

        One log line per topic, with its count: a typo'd topic of a million
        messages is one line, not a million.
        """
        now = self.clock() if self.clock else None
        buried = await self.store.bury_unserved(self.config.unserved_grace, now=now)
        grace = format_duration(self.config.unserved_grace)
        for topic, count in buried.items():
            self.metrics.topic(topic).buried.inc(count)
            log.error(
                "messages buried: topic=%s count=%d reason=no handler for topic %s "
                "(no live relay served it for %s)",
                topic,
                count,
                topic,
                grace,
            )
        return sum(buried.values())

    async def leave(self) -> None:
        """Remove this relay's row (a clean exit)."""
        await self.store.unregister_relay(self.id)
