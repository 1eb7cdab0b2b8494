"""Settling: each delivery's outcome written soon, in few statements, fenced by its lease.

Outcomes queue up while a write is under way and go out together: one
statement per kind (acks, retries, burials, releases) for everything that
finished meanwhile, so a busy relay coalesces its writes and an idle one
writes at once. Acks go first: a message that was delivered must not be
handed back for another delivery.

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
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import anyio

from outbox.durations import format_duration
from outbox.errors import StoreUnavailable
from outbox.message import Message
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Route
from outbox.store import RelayStore

__all__ = ["REASON_MAX", "Held", "Settler", "clean_reason"]

log = logging.getLogger("outbox.relay")

REASON_MAX = 2000
"""Longest reason kept, in characters."""

_FIRST_WAIT = 0.05
_RETRY_CEILING = 1.0
T = TypeVar("T")
R = TypeVar("R")


def _tokens(held: list[Held]) -> set[uuid.UUID]:
    """The lease tokens of ``held``: the messages of one claim share one, so
    each is hashed once, not once a message."""
    tokens: set[uuid.UUID] = set()
    last = None
    for h in held:
        token = h.message.lease
        if token is not last and token is not None:
            tokens.add(token)
            last = token
    return tokens


def clean_reason(text: str) -> str:
    """``text`` as a reason PostgreSQL can store: no NUL, no lone surrogate, capped."""
    # A UTF-16 round trip joins surrogate pairs and replaces lone halves.
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    text = text.replace("\x00", "\ufffd")
    if len(text) > REASON_MAX:
        text = text[: REASON_MAX - 1] + "…"
    return text


@dataclasses.dataclass(slots=True, eq=False)
class Held:
    """A message this relay has claimed and not yet settled."""

    message: Message
    route: Route | None
    """How its topic is delivered (None: no route serves its topic any more, the
    registry changed since the claim; it is released for another relay)."""
    lease_end: float
    """When its lease ends, on the monotonic clock (a little early: measured
    before the claim was sent)."""
    solo: bool = False
    decided: bool = False
    """Its outcome is known (queued for writing, or written)."""
    acked: bool = False
    """Its ack is in the store (a key's next message waits for it)."""
    followed: bool = False
    """This relay holds the next message of its key (its ack unparks nothing)."""
    settled: bool = False
    """Its outcome's write is over (done, fenced out, or given up)."""


Outcome = TypeVar("Outcome", tuple[Held, dt.timedelta, str, bool], tuple[Held, str])


class Settler:
    """Writes outcomes for one relay; ``run()`` flushes whenever some are queued.

    ``written`` is called for each message once its outcome's write is over
    (done, fenced out, or given up): only then does it stop taking a slot, so
    a relay that dies repeats at most its slots' worth of deliveries.
    """

    def __init__(
        self,
        store: RelayStore,
        metrics: RelayMetrics,
        now: Callable[[], dt.datetime | None],
        written: Callable[[Held], None] = lambda held: None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.now = now
        self.written = written
        self.acks: list[Held] = []
        self.dropped: dict[uuid.UUID, str] = {}
        self.retries: list[tuple[Held, dt.timedelta, str, bool]] = []
        self.buries: list[tuple[Held, str]] = []
        self.releases: list[Held] = []
        self._ready: anyio.Event | None = None
        self._lock: anyio.Lock | None = None
        self._closed = False
        self._round_over: anyio.Event | None = None
        """Set (and replaced) as each round of writes ends."""

    # -- queueing (synchronous, cheap: called once per delivery) -------------

    def ack(self, held: Held, dropped: str | None = None) -> None:
        self.acks.append(held)
        if dropped is not None:
            self.dropped[held.message.id] = dropped
        if not held.followed:  # a run's ack is written by its settled() call
            self._poke()

    def retry(self, held: Held, delay: dt.timedelta, reason: str, *, counted: bool = True) -> None:
        """Retry after ``delay``; ``counted`` False hands the attempt back (Unavailable)."""
        self.retries.append((held, delay, clean_reason(reason), counted))
        self._poke()

    def bury(self, held: Held, reason: str) -> None:
        self.buries.append((held, clean_reason(reason)))
        self._poke()

    def release(self, held: Held) -> None:
        self.releases.append(held)
        self._poke()

    def pending(self) -> bool:
        return bool(self.acks or self.retries or self.buries or self.releases)

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
        """Write what is queued: acks, retries, burials, releases, a statement each."""
        acks, self.acks = self.acks, []
        dropped, self.dropped = self.dropped, {}
        retries, self.retries = self.retries, []
        buries, self.buries = self.buries, []
        releases, self.releases = self.releases, []
        stage = 0
        try:
            if acks:
                await self._acks(acks, dropped)
                self._over(acks)
            stage = 1
            if retries:
                await self._retries(retries)
                self._over(h for h, _, _, _ in retries)
            stage = 2
            if buries:
                await self._buries(buries)
                self._over(h for h, _ in buries)
            stage = 3
            if releases:
                await self._releases(releases)
                self._over(releases)
        except BaseException:
            if stage <= 0:
                self.acks[:0] = acks
                self.dropped.update(dropped)
            if stage <= 1:
                self.retries[:0] = retries
            if stage <= 2:
                self.buries[:0] = buries
            self.releases[:0] = releases
            raise

    def _over(self, items: Iterable[Held]) -> None:
        for held in items:
            held.settled = True
            self.written(held)

    async def _acks(self, acks: list[Held], dropped: dict[uuid.UUID, str]) -> None:
        done = await self._persist("ack", acks, lambda h: h, self._ack_many)
        if done is None:
            return
        debug = log.isEnabledFor(logging.DEBUG)
        delivered: collections.Counter[str] = collections.Counter()
        items, removed = done
        for h in items:
            m = h.message
            if m.key is not None and m.id not in removed:
                self._lost(m, "ack")  # the current holder's delivery goes on
                continue
            h.acked = True
            reason = dropped.get(m.id) if dropped else None
            if reason is None:
                delivered[m.topic] += 1
                if debug:
                    log.debug("acked message=%s topic=%s attempt=%d", m.id, m.topic, m.attempts)
            else:
                self.metrics.dropped.labels(self.metrics.label(m.topic), reason).inc()
                log.info("message dropped: message=%s topic=%s reason=%s", m.id, m.topic, reason)
        for topic, n in delivered.items():  # one increment a topic, not one a message
            self.metrics.topic(topic).delivered.inc(n)

    def _ack_many(self, items: list[Held]) -> Awaitable[set[uuid.UUID]]:
        ids = [h.message.id for h in items]
        keyed = [h for h in items if h.message.key is not None]
        if not keyed:  # the common case: the plain DELETE
            return self.store.ack_many(ids, keyed=False)
        followed = all(h.followed for h in keyed)
        return self.store.ack_many(
            ids,
            # Keyed acks are fenced by the lease (see Store.ack_many).
            tokens=_tokens(keyed),
            # A followed message's successor is this relay's already: nothing
            # to unpark behind it.
            keyed=not followed,
            # Only a run's acks wait on each other: one flush to disk each
            # would be most of a hot key's time (see message_ack_run).
            durable=len(keyed) < len(items) or not followed,
        )

    async def _retries(self, retries: list[tuple[Held, dt.timedelta, str, bool]]) -> None:
        await self._fenced(
            "retry",
            retries,
            lambda items: self.store.retry_many(
                [(h.message, delay, reason) for h, delay, reason, _ in items],
                now=self.now(),
                uncounted={h.message.id for h, _, _, counted in items if not counted},
            ),
            self._retried,
        )

    async def _buries(self, buries: list[tuple[Held, str]]) -> None:
        await self._fenced(
            "burial",
            buries,
            lambda items: self.store.bury_many(
                [(h.message, reason) for h, reason in items], now=self.now()
            ),
            self._buried,
        )

    async def _fenced(
        self,
        what: str,
        items: list[Outcome],
        write: Callable[[list[Outcome]], Awaitable[set[uuid.UUID]]],
        report: Callable[[Outcome], None],
    ) -> None:
        """Write fenced outcomes; report those written, count the rest as lost leases."""
        done = await self._persist(what, items, lambda item: item[0], write)
        if done is None:
            return
        for item in done[0]:
            if item[0].message.id in done[1]:
                report(item)
            else:
                self._lost(item[0].message, what)

    def _retried(self, item: tuple[Held, dt.timedelta, str, bool]) -> None:
        held, delay, reason, counted = item
        m = held.message
        self.metrics.topic(m.topic).retried.inc()
        # An uncounted retry means the receiver is down; its handler says so once.
        log.log(
            logging.WARNING if counted else logging.DEBUG,
            "delivery failed: message=%s topic=%s attempt=%d retry_in=%s error=%s",
            m.id,
            m.topic,
            m.attempts,
            format_duration(delay),
            reason,
        )

    def _buried(self, item: tuple[Held, str]) -> None:
        m, reason = item[0].message, item[1]
        self.metrics.topic(m.topic).buried.inc()
        log.error(
            "message buried: message=%s topic=%s attempt=%d reason=%s",
            m.id,
            m.topic,
            m.attempts,
            reason,
        )

    async def _releases(self, releases: list[Held]) -> None:
        done = await self._persist(
            "release",
            releases,
            lambda h: h,
            lambda items: self.store.release([h.message for h in items], self.now()),
        )
        if done is None:
            return
        items, written = done
        for h in items:
            if h.message.id not in written:
                self._lost(h.message, "release")
        if len(written):
            log.info("released %d unfinished messages for another relay", len(written))

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

    async def _persist(
        self,
        what: str,
        items: list[T],
        held: Callable[[T], Held],
        write: Callable[[list[T]], Awaitable[R]],
    ) -> tuple[list[T], R] | None:
        """``write(items)``, tried again while the store is unavailable and leases last."""
        wait = _FIRST_WAIT
        while True:
            try:
                return items, await write(items)
            except StoreUnavailable as exc:
                if wait == _FIRST_WAIT:
                    log.warning(
                        "could not %s %d messages: %s; trying again until their leases end",
                        what,
                        len(items),
                        exc,
                    )
                deadline = time.monotonic() + wait
                alive = [i for i in items if held(i).lease_end > deadline]
                if len(alive) < len(items):
                    log.warning(
                        "could not %s %d messages before their leases ended (%s); "
                        "another relay will deliver them again",
                        what,
                        len(items) - len(alive),
                        exc,
                    )
                if not alive:
                    return None
                items = alive
                await anyio.sleep(wait)
                wait = min(wait * 2, _RETRY_CEILING)
            except Exception:
                log.exception(
                    "could not %s %d messages; their leases will run out and another "
                    "relay will deliver them again",
                    what,
                    len(items),
                )
                return None
