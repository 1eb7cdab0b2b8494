"""Settling: each delivery's outcome written soon, in few statements, fenced by its lease.

Outcomes queue up while a write is under way and go out together: one
settlement (``store.settle``) for everything that finished meanwhile, so a
busy relay coalesces its writes and an idle one writes at once. The store
writes acks first: a message that was delivered must not be handed back for
another delivery.

A retry, burial or release carries the lease token of the claim it answers;
the store applies it only while that lease still holds the message. One that
finds its lease gone (this relay stalled past it and another claim took the
message) changed nothing: it is logged once as "lease lost" and counted in
outbox_lease_lost_total. While the store is briefly unavailable, writes are
tried again until the message's lease ends; past that another relay will
deliver it again anyway, and the loss is logged, never silent.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable

import anyio

from outbox.durations import format_duration
from outbox.errors import StoreUnavailable
from outbox.message import Message
from outbox.relay.inflight import Held, InFlight
from outbox.relay.metrics import RelayMetrics
from outbox.requests import Acked, Buried, Outcome, Released, Retried, Settled
from outbox.store import RelayStore

__all__ = ["REASON_MAX", "Settler", "clean_reason"]

log = logging.getLogger("outbox.relay")

REASON_MAX = 2000
"""Longest reason kept, in characters."""

_FIRST_WAIT = 0.05
_RETRY_CEILING = 1.0


def clean_reason(text: str) -> str:
    """``text`` as a reason PostgreSQL can store: no NUL, no lone surrogate, capped."""
    # A UTF-16 round trip joins surrogate pairs and replaces lone halves.
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    text = text.replace("\x00", "\ufffd")
    if len(text) > REASON_MAX:
        text = text[: REASON_MAX - 1] + "…"
    return text


class Settler:
    """Writes outcomes for one relay; ``run()`` flushes whenever some are queued.

    Each delivery's outcome comes in once, through :meth:`report`. Once its
    write is over (done, fenced out, or given up) the message stops taking a
    slot in ``in_flight``, so a relay that dies repeats at most its slots'
    worth of deliveries; ``wake`` asks the relay to claim at once when an ack
    unparked a key's next message (nobody notifies an unpark).
    """

    def __init__(
        self,
        store: RelayStore,
        metrics: RelayMetrics,
        now: Callable[[], dt.datetime | None],
        in_flight: InFlight,
        wake: Callable[[], None],
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.now = now
        self.in_flight = in_flight
        self.wake = wake
        self.queued: list[Held] = []
        self.outcomes: list[Outcome] = []
        """The outcome of each message queued, in step with ``queued``."""
        self.dropped: dict[uuid.UUID, str] = {}
        """Acks of messages a handler dropped, with its reason (counted apart)."""
        self._delivered: collections.Counter[str] = collections.Counter()
        self._released = 0
        self._debug = False
        self._ready: anyio.Event | None = None
        self._lock: anyio.Lock | None = None
        self._closed = False
        self._round_over: anyio.Event | None = None
        """Set (and replaced) as each round of writes ends."""

    # -- queueing (synchronous, cheap: called once per delivery) -------------

    def report(self, held: Held, outcome: Outcome, dropped: str | None = None) -> None:
        """``held``'s outcome: it no longer counts against its topic, and it is
        queued for the next round of writes (``dropped``: the handler's reason
        for an ack it dropped)."""
        self.in_flight.decide(held)
        self.queued.append(held)
        self.outcomes.append(outcome)
        if dropped is not None:
            self.dropped[held.message.id] = dropped
        if not held.followed or type(outcome) is not Acked:
            self._poke()  # a run's ack is written by its settled() call

    def pending(self) -> bool:
        return bool(self.queued)

    def _poke(self) -> None:
        if self._ready is not None and not self._ready.is_set():
            self._ready.set()

    # -- writing ---------------------------------------------------------------

    async def run(self) -> None:
        """Flush whenever outcomes are queued, until cancelled or closed and flushed."""
        self._closed = False
        while True:
            self._ready = anyio.Event()
            if not self.pending():
                if self._closed:
                    return
                await self._ready.wait()
                self._ready = anyio.Event()
            await self.flush()

    async def settled(self, held: Held) -> None:
        """Return once ``held``'s queued outcome was written (or given up), in a
        round with whatever else was queued by then: a key's next message waits
        on its predecessor's ack this way, while the acks of many keys still
        share statements. With no round under way it writes one itself, a task
        switch sooner than run() would.
        """
        lock = self._lock_()
        try:
            await self._settle(held, lock)
        finally:
            if not held.settled:  # cancelled: leave the rest to run()
                self._poke()

    async def _settle(self, held: Held, lock: anyio.Lock) -> None:
        while not held.settled:
            if lock.locked():
                if self._round_over is None:
                    self._round_over = anyio.Event()
                await self._round_over.wait()
                continue
            # No round under way: write one now, without the task switch a
            # contended acquire() would cost (a hot key pays it per message).
            lock.acquire_nowait()
            try:
                if not self.pending():
                    return  # nothing of held's is queued
                await self._round()
            finally:
                lock.release()

    def close(self) -> None:
        """Let run() return once it has written what is queued."""
        self._closed = True
        if self._ready is not None:
            self._ready.set()

    async def flush(self) -> None:
        """Write everything queued, acks first; return once nothing is queued.

        Cancelled mid-write, it puts back what it had not confirmed, so a
        relay's last flush (shielded) still writes it.
        """
        async with self._lock_():
            while self.pending():
                await self._round()

    def _lock_(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    async def _round(self) -> None:
        """One round of writes (the lock held); then wake whoever waits for one."""
        try:
            await self._write_round()
        finally:
            over, self._round_over = self._round_over, None
            if over is not None:
                over.set()

    async def _write_round(self) -> None:
        """Write what is queued, one settlement; put it back if cancelled before
        it was confirmed (a mixed settlement writes all or nothing)."""
        queued, self.queued = self.queued, []
        outcomes, self.outcomes = self.outcomes, []
        dropped, self.dropped = self.dropped, {}
        self._debug = log.isEnabledFor(logging.DEBUG)
        try:
            settled, given_up = await self._send(queued, outcomes)
        except BaseException:
            self.queued[:0] = queued
            self.outcomes[:0] = outcomes
            self.dropped.update(dropped)
            raise
        in_flight, delivered, debug, wake = self.in_flight, self._delivered, self._debug, False
        acked = settled.acked if settled is not None else set()
        for held, outcome in zip(queued, outcomes, strict=True):
            m = held.message
            if settled is None or (given_up and m.id in given_up):
                pass  # not written, and said so
            elif type(outcome) is Acked and not dropped and (m.key is None or m.id in acked):
                # A delivered message (an unkeyed one whoever removed it): the
                # common case, once a message, inline.
                held.acked = True
                delivered[m.topic] += 1
                if debug:
                    log.debug("acked message=%s topic=%s attempt=%d", m.id, m.topic, m.attempts)
            else:
                self._report(held, outcome, settled, dropped)
            held.settled = True
            if in_flight.free(held) and held.acked and m.key is not None and not held.followed:
                wake = True  # the ack unparked the key's next message: claim it now
        if settled is not None:
            self._counted()
        if wake:
            self.wake()

    async def _send(
        self, queued: list[Held], outcomes: list[Outcome]
    ) -> tuple[Settled | None, set[uuid.UUID]]:
        """``store.settle``, sent again while the store is unavailable and the
        leases last; None once it is given up, with the ids given up on (each
        logged: another relay will deliver them again)."""
        wait = _FIRST_WAIT
        given_up: set[uuid.UUID] = set()
        while True:
            try:
                return await self.store.settle(outcomes, now=self.now()), given_up
            except StoreUnavailable as exc:
                if wait == _FIRST_WAIT:
                    log.warning(
                        "could not settle %d messages: %s; trying again until their leases end",
                        len(outcomes),
                        exc,
                    )
                deadline = time.monotonic() + wait
                alive = [
                    (h, o) for h, o in zip(queued, outcomes, strict=True) if h.lease_end > deadline
                ]
                if len(alive) < len(outcomes):
                    log.warning(
                        "could not settle %d messages before their leases ended (%s); "
                        "another relay will deliver them again",
                        len(outcomes) - len(alive),
                        exc,
                    )
                    given_up.update(h.message.id for h in queued if h.lease_end <= deadline)
                if not alive:
                    return None, given_up
                queued, outcomes = [h for h, _ in alive], [o for _, o in alive]
                await anyio.sleep(wait)
                wait = min(wait * 2, _RETRY_CEILING)
            except Exception:
                log.exception(
                    "could not settle %d messages; their leases will run out and another "
                    "relay will deliver them again",
                    len(outcomes),
                )
                return None, given_up

    def _report(
        self, held: Held, outcome: Outcome, settled: Settled, dropped: dict[uuid.UUID, str]
    ) -> None:
        """Log and count one written outcome; a fenced one not written lost its lease."""
        m = held.message
        if type(outcome) is Acked:  # once a delivered message: the cheap test first
            # An unkeyed message was delivered whoever removed it.
            if m.key is not None and m.id not in settled.acked:
                self._lost(m, "ack")  # the current holder's delivery goes on
                return
            held.acked = True
            reason = dropped.get(m.id) if dropped else None
            if reason is None:
                self._delivered[m.topic] += 1
                if self._debug:
                    log.debug("acked message=%s topic=%s attempt=%d", m.id, m.topic, m.attempts)
            else:
                self.metrics.dropped.labels(self.metrics.label(m.topic), reason).inc()
                log.info("message dropped: message=%s topic=%s reason=%s", m.id, m.topic, reason)
        elif type(outcome) is Retried and m.id in settled.retried:
            self.metrics.topic(m.topic).retried.inc()
            # An uncounted retry: the receiver is down; its handler says so once.
            log.log(
                logging.WARNING if outcome.counted else logging.DEBUG,
                "delivery failed: message=%s topic=%s attempt=%d retry_in=%s error=%s",
                m.id,
                m.topic,
                m.attempts,
                format_duration(outcome.delay),
                outcome.reason,
            )
        elif type(outcome) is Buried and m.id in settled.buried:
            self.metrics.topic(m.topic).buried.inc()
            log.error(
                "message buried: message=%s topic=%s attempt=%d reason=%s",
                m.id,
                m.topic,
                m.attempts,
                outcome.reason,
            )
        elif type(outcome) is Released and m.id in settled.released:
            self._released += 1
        elif type(outcome) is not Acked:
            self._lost(m, _WHAT[type(outcome)])

    def _counted(self) -> None:
        """Count a round's deliveries, one increment a topic, not one a message."""
        for topic, n in self._delivered.items():
            self.metrics.topic(topic).delivered.inc(n)
        self._delivered.clear()
        if self._released:
            log.info("released %d unfinished messages for another relay", self._released)
            self._released = 0

    def _lost(self, m: Message, what: str) -> None:
        self.metrics.topic(m.topic).lease_lost.inc()
        log.warning(
            "lease lost: message=%s topic=%s attempt=%d; another claim holds it now, "
            "so this relay's %s changed nothing",
            m.id,
            m.topic,
            m.attempts,
            what,
        )


_WHAT = {Acked: "ack", Retried: "retry", Buried: "burial", Released: "release"}
