"""The relay: claim due messages under a lease, deliver each, settle the outcome.

Delivery is at least once. A relay can crash after a handler succeeded and
before the ack; the lease then runs out and a relay delivers the message again.
Handlers must make a repeat harmless (the message id is the tool for that).

``run()`` is a continuous pipeline: up to OUTBOX_CONCURRENCY deliveries in
flight, more claimed as slots free up (never more than are free), each
message settled as soon as its handler returns. A slow or hanging handler
holds one slot, never the relay; a topic's maxInFlight keeps one slow topic
from taking every slot. ``poll()`` is one round of the same parts (claim,
deliver, settle), for tests and ``drain()``.

Outcomes: success acks; any exception (a handler's own CancelledError too)
retries after backoff(attempts); Permanent and the last allowed attempt bury.
An orphan (a message whose lease ran out unsettled) is delivered on its own,
with nothing else in flight: if it crashes its relay again, only it is
blamed, and a message that keeps doing so is buried as a likely poison.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from outbox.clock import Clock, system_clock
from outbox.errors import StoreUnavailable
from outbox.message import validate_topic
from outbox.relay.backlog import Backlog
from outbox.relay.config import (
    CLAIM_WAIT,
    FULL_LOOK,
    KEY_RUN,
    STORE_WAIT,
    WATERMARK_SLACK,
    RelayConfig,
)
from outbox.relay.deliver import Deliveries
from outbox.relay.fleet import Fleet
from outbox.relay.housekeeping import Housekeeper
from outbox.relay.inflight import Held, InFlight
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Handler, HandlerKind, Router
from outbox.relay.settle import Settler
from outbox.requests import Claimed, ClaimRequest, Orphans, Released
from outbox.store import Store
from outbox.tracing import DeliveryTracer
from outbox.wake import WAKE_WINDOW

__all__ = ["Relay"]

log = logging.getLogger("outbox.relay")

# The loop's wait after a failed claim doubles from the interval up to this;
# while the store is unreachable only up to the second, so that a relay
# delivers again within seconds of the database's return (a try is a connect).
_FAILURE_BACKOFF_CEILING = 30.0
_OUTAGE_BACKOFF_CEILING = 5.0
# How long a cancelled relay may spend settling and handing its messages back.
_HAND_BACK_GRACE = 2.0
# How long a stopping relay waits for housekeeping to reach its next wait.
_HOUSEKEEPING_GRACE = 1.0


class Relay:
    """Delivers due messages from ``store`` to the handler for each topic.

    ``clock`` None (production): the store's time (the database's ``now()``)
    decides leases and retries. An injected clock is passed to the store as
    its time, so tests move it instead of sleeping. ``tracer`` records a span
    per delivery (outbox.tracing); ``host`` is how `outbox relays` names this
    relay (default: the machine's host name).
    """

    store: Store[Any]  # it claims and writes back (RelayStore); its gauges read (Operator)

    def __init__(
        self,
        store: Store[Any],
        handlers: Mapping[str, Handler],
        config: RelayConfig | None = None,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        kinds: Mapping[str, HandlerKind] | None = None,
        listen: bool = True,
        backlog: dt.timedelta | None = dt.timedelta(seconds=15),
        tracer: DeliveryTracer | None = None,
        host: str | None = None,
    ) -> None:
        for topic in handlers:
            validate_topic(topic)
        self.store = store
        # RelayConfig's defaults unless the caller passes one (the process
        # reads the environment's with outbox.service.settings.relay_config()).
        self.config = cfg = config if config is not None else RelayConfig.model_validate({})
        self.clock = clock
        self.listen = listen
        """Whether run() listens for the store's wake-ups (``store.wakeups``)."""
        self.backlog = backlog
        """How often run() refreshes the backlog gauges (None: never)."""
        self._local = clock or system_clock
        self.router = Router(handlers, kinds or {}, cfg)
        self.metrics = RelayMetrics.of(registry)
        self._held = held = InFlight()
        self.metrics.in_flight.set_function(lambda: len(held))
        self.settler = Settler(store, self.metrics, self._store_now, held, wake=self._unparked)
        self.deliveries = Deliveries(
            held, self.settler, self.metrics, stopping=lambda: self._stopping, tracer=tracer
        )
        self.fleet = Fleet(store, self.router, cfg, self.metrics, clock=clock, host=host)
        # Export every known topic's counters at 0 from the start: increase()
        # needs a sample before the first burial to see it.
        self.metrics.label_topics(self.router.served)
        self.slots = cfg.slots
        self._claim_size = cfg.batch
        self._lease = cfg.lease.total_seconds()
        self.housekeeper = Housekeeper(
            store,
            self.router,
            self.fleet,
            self.metrics,
            cfg,
            clock=self._local,
            stopping=lambda: self._stopping,
            wait=self._sleep,
            signal=held.signal,
        )
        """The registry, this relay's row in the fleet and the sweep, each when due."""
        self._orphans = False
        self._stopping = False
        self._wake: anyio.Event | None = None
        self._nudged = False
        self._nap: anyio.Event | None = None
        self._report_by = math.inf
        self._woke_at = 0.0
        """When (monotonic) an idle relay last claimed for a wake-up."""
        self._gauges: Backlog | None = None
        self._mark: dt.datetime | None = None
        """While a snapshot is held: where the next claim reads the ready rows from."""
        self._full_at = 0.0
        """When (monotonic) the next claim reads them from the first again."""

    # -- control -----------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming. run() returns once the deliveries in flight are settled.

        Handlers in flight keep their deadline (the timeout); those still
        running then are cancelled and their messages released, due at once,
        so another relay takes them without waiting for the lease to end.
        """
        self._stopping = True
        self._held.signal()
        if self._wake is not None:
            self._wake.set()
        if self._nap is not None:
            self._nap.set()

    def wake(self, topics: Iterable[str] | None = None) -> None:
        """Messages of ``topics`` (None: any) were committed: claim now, not after the wait.

        Cheap and safe to call for every notification. An idle relay claims at
        once, and once more ``WAKE_WINDOW`` later (a producer sends at most one
        notification a window, so that claim finds what the window's later
        commits added). A busy relay claims again anyway: it only notes it.
        One that serves none of ``topics`` stays asleep.
        """
        if topics is None:
            if self._nudged:  # noted already (a busy relay's acks note it for each key)
                return
        elif self.router.claimable.isdisjoint(topics):
            return
        self._nudged = True
        if self._nap is not None:
            self._nap.set()

    @property
    def housekeeping_failing(self) -> bool:
        """Whether the last registry read, registration or sweep failed (True until
        the first succeeds: a relay the fleet cannot see yet is not ready)."""
        return self.housekeeper.failing

    async def housekeep(self, *, force: bool = False) -> None:
        """Read the registry, refresh this relay's registration and sweep, as each is due."""
        await self.housekeeper.once(force=force)

    async def refresh_topics(self) -> None:
        """Read the topic registry now (housekeeping does it at most once an interval)."""
        await self.housekeeper.refresh_topics()

    @property
    def stopping(self) -> bool:
        """Whether stop() was called."""
        return self._stopping

    @property
    def in_flight(self) -> int:
        """Messages claimed and not yet settled."""
        return len(self._held)

    def alive(self) -> bool:
        """Whether run()'s loop reported in time: a claim, a wait for a free slot
        (handlers finish within the timeout) or for due messages, plus three
        intervals to spare."""
        return time.monotonic() <= self._report_by

    # -- one round at a time (tests, drain) -------------------------------------

    async def drain(self) -> int:
        """Handle everything due until nothing is; return how many were handled."""
        total = 0
        while handled := await self.poll():
            total += handled
        return total

    async def poll(self) -> int:
        """Claim one batch, deliver it and settle it; then any orphans, one at a time.

        Returns how many messages were claimed.
        """
        await self.housekeeper.once()
        claimed = await self._claim(min(self.config.batch, self.slots))
        async with anyio.create_task_group() as tg:
            await self.deliveries.start(claimed.messages, tg)
        await self.settler.flush()
        handled = len(claimed.messages)
        while self._orphans:
            handled += await self._deliver_orphan()
        return handled

    # -- the continuous pipeline -------------------------------------------------

    async def run(self) -> None:
        """Deliver until stopped or cancelled, waiting ``interval`` when nothing is due.

        A failing store is logged and retried with a capped backoff; it never
        ends the loop. On the way out, what was delivered is acked first, what
        is unfinished is released, and the relay leaves the fleet.
        """
        self._wake = anyio.Event()
        if self._stopping:
            return
        # The listener and the backlog gauges run beside the loop, stopped
        # before the hand-back: a wake-up then must not start a claim.
        async with anyio.create_task_group() as ears:
            if self.listen:
                ears.start_soon(self.store.wakeups, self.wake)
            if self.backlog is not None:
                gauges = Backlog(
                    self.store,
                    clock=self._local,
                    registry=self.metrics.registry,
                    label=self.metrics.label,
                    held_after=self.config.snapshot_held_after,
                )
                ears.start_soon(gauges.run, self.backlog)
                self._gauges = gauges
            try:
                await self._run()
            finally:
                ears.cancel_scope.cancel()
        log.info("relay stopped claiming")

    async def _run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.settler.run)
                housekeeping = anyio.CancelScope()
                tg.start_soon(self.housekeeper.run, housekeeping)
                await self._feed(tg)
                await self._held.until(lambda: self.deliveries.workers == 0)
                self.settler.close()  # its run() returns once it wrote what is queued
                # Housekeeping ends at its next wait; one stuck waiting for an
                # unreachable store is not worth the shutdown's time.
                with anyio.move_on_after(_HOUSEKEEPING_GRACE):
                    await self._held.until(lambda: self.housekeeper.done)
                housekeeping.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_HAND_BACK_GRACE):
                await self._hand_back()

    async def _feed(self, tg: anyio.abc.TaskGroup) -> None:
        cfg = self.config
        interval = cfg.interval.total_seconds()
        # Each step finishes within a handler's timeout (a slot frees) or a wait
        # for the store (bounded by the pool's own wait), plus three intervals:
        # an unreachable database is readiness's business, not liveness's.
        slack = cfg.timeout.total_seconds() + 3 * interval + STORE_WAIT
        failures = 0
        while not self._stopping:
            self._report_by = time.monotonic() + slack
            woken, self._nudged = self._nudged, False
            try:
                idle = await self._feed_once(tg)
            except Exception as exc:
                if isinstance(exc, StoreUnavailable):
                    self.metrics.database_up.set(0)
                failures += 1
                unavailable = isinstance(exc, StoreUnavailable)
                ceiling = _OUTAGE_BACKOFF_CEILING if unavailable else _FAILURE_BACKOFF_CEILING
                wait = min(interval * 2**failures, ceiling)
                if not unavailable:
                    log.exception("poll failed; next try in %.1fs", wait)
                elif failures == 1:  # said once; the recovery is said once too
                    log.warning(
                        "poll failed: %s; trying again with backoff, at least every %gs",
                        exc,
                        max(ceiling, interval),
                    )
                else:
                    log.debug("poll failed again: %s; next try in %.1fs", exc, wait)
                await self._sleep(wait, slack)
                continue
            if failures:
                log.info("store reachable again after %d failed polls", failures)
                failures = 0
            if idle:
                await self._idle(interval, slack, woken)

    async def _idle(self, interval: float, slack: float, woken: bool) -> None:
        """Nothing is due: wait an interval, or until woken (see wake()).

        After a claim a wake-up caused, wait only a window: a producer that
        committed within the window after its last notification sent none.
        """
        self._nap = anyio.Event()
        if self._stopping:
            return
        # Woken while claiming: claim again at once (paced below); else wait.
        if not self._nudged:
            if woken:
                interval = min(interval, WAKE_WINDOW)
            self._report_by = time.monotonic() + interval + slack
            with anyio.move_on_after(interval):
                await self._nap.wait()
        if self._nudged and not self._stopping:
            # Any role that can connect may NOTIFY: however many arrive, an
            # idle relay claims for them at most once a window.
            gap = self._woke_at + WAKE_WINDOW - time.monotonic()
            if gap > 0:
                await anyio.sleep(gap)
            self._woke_at = time.monotonic()

    async def _feed_once(self, tg: anyio.abc.TaskGroup) -> bool:
        """One step of the feeder; True when nothing more is due now."""
        if not self.housekeeper.routed:  # never claim before the registry was read
            try:
                await self.housekeeper.once()
            except StoreUnavailable:
                raise
            except Exception:
                if not self.housekeeper.routed:
                    raise
                # The registry was read; registering or sweeping failed, which
                # the housekeeping task reports (once) and retries.
            return False
        if self._orphans:
            await self._held.until(lambda: not self._held)
            if not self._stopping:
                await self._deliver_orphan(tg)
            return False
        held = self._held
        free = self.slots - len(held)
        if free <= 0:
            await held.until(lambda: len(held) < self.slots)
            return False
        room = self.config.in_flight_bytes - held.bytes
        if room <= 0:
            await held.until(lambda: held.bytes < self.config.in_flight_bytes)
            return False
        want = min(self._claim_size, free)
        claimed = await self._claim(want, max_bytes=room)
        self.metrics.database_up.set(1)
        self.metrics.last_poll.set(time.time())
        await self.deliveries.start(claimed.messages, tg)
        short = len(claimed.messages) + claimed.orphans < want
        # A claim costs about as much for one row as for a hundred: while the
        # backlog fills every claim and handlers free slots as fast, claim
        # twice as many next time, up to the slots; a short claim (the backlog
        # is drained) goes back to OUTBOX_BATCH. Slow handlers keep claims
        # small by themselves: a claim never takes more than the free slots.
        if short:
            self._claim_size = self.config.batch
        elif want == self._claim_size:
            self._claim_size = min(2 * want, self.slots)
        return short

    async def _hand_back(self) -> None:
        """Ack what was delivered, release what is unfinished, leave the fleet."""
        await self.settler.flush()
        self.deliveries.clear()
        for held in self._held.undecided():
            self.settler.report(held, Released(held.message))
        await self.settler.flush()
        try:
            await self.fleet.leave()
        except Exception as exc:
            log.warning("could not remove this relay from outbox_relays: %s", exc)

    # -- claiming --------------------------------------------------------------

    async def _claim(
        self, limit: int, *, solo: bool = False, max_bytes: int | None = None
    ) -> Claimed:
        """Claim up to ``limit`` for the free slots (``solo``: one orphan) and hold it."""
        router = self.router
        caps = None
        if router.capped:
            caps = {t: cap - self._held.load[t] for t, cap in router.capped.items()}
        if not router.free and not caps:
            return Claimed()
        after = self._watermark(solo)
        request = ClaimRequest(
            limit=limit,
            lease=self.config.lease,
            now=self._store_now(),
            topics=router.free,
            caps=caps or {},
            # Orphans are delivered alone, each its own claim: the one that
            # kills its relay is found by itself.
            orphans=Orphans.ONLY if solo else Orphans.LEAVE,
            max_bytes=max_bytes,
            run=KEY_RUN,
            room=max(limit, (self.slots - len(self._held)) // 2),  # see KEY_RUN
            after=after,
        )
        lease_end = time.monotonic() + self._lease
        # A claim is never abandoned midway: cancelled then, its statement may
        # still commit on the server, and messages nobody holds would wait out
        # their lease. Shielded (within the store's deadline, or CLAIM_WAIT),
        # what it claimed is held, so a stopping relay hands it back.
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(CLAIM_WAIT):
                    claimed = await self.store.claim_many(request)
            except TimeoutError:
                raise StoreUnavailable(f"no claim within {CLAIM_WAIT:g}s") from None
        if claimed.last_due is not None:
            mark = claimed.last_due - WATERMARK_SLACK
            self._mark = mark if after is None or self._mark is None else max(self._mark, mark)
        if claimed.orphans:
            self._orphans = True
        for m in claimed.messages:
            self._held.hold(Held(m, router.routes.get(m.topic), lease_end, solo))
        return claimed

    def _watermark(self, solo: bool) -> dt.datetime | None:
        """Where a claim reads the ready rows from: the first, unless a snapshot is
        held. Then every entry of what was claimed and settled since it began
        stays in the ready index, and a claim from the first would visit each
        (docs/design/held-snapshots.md): it reads on from where the last one
        stopped, and from the first at least every FULL_LOOK seconds."""
        if solo or self._gauges is None or not self._gauges.held:
            return None
        if self._mark is not None and time.monotonic() < self._full_at:
            return self._mark
        self._full_at = time.monotonic() + FULL_LOOK
        return None

    def _unparked(self) -> None:
        """An ack unparked a key's next message, whose due time may be before the
        watermark: the next claim reads from the first."""
        self._full_at = 0.0
        self.wake()

    async def _deliver_orphan(self, tg: anyio.abc.TaskGroup | None = None) -> int:
        """Claim one orphan and deliver it alone; return 1, or 0 when none is left."""
        claimed = (await self._claim(1, solo=True)).messages
        if not claimed:
            self._orphans = False
            return 0
        if tg is None:
            async with anyio.create_task_group() as own:
                await self.deliveries.start(claimed, own)
            await self.settler.flush()
        else:
            await self.deliveries.start(claimed, tg)
            await self._held.until(lambda: not self._held)
        return 1

    # -- waiting ---------------------------------------------------------------

    async def _sleep(self, seconds: float, slack: float | None = None) -> None:
        """Wait ``seconds`` or until stopped; with ``slack``, report alive until then."""
        if self._stopping or self._wake is None:
            return
        if slack is not None:
            self._report_by = time.monotonic() + seconds + slack
        with anyio.move_on_after(seconds):
            await self._wake.wait()

    def _store_now(self) -> dt.datetime | None:
        return self.clock() if self.clock is not None else None
