"""Delivering what a relay claimed: workers, handlers, outcomes.

Claimed messages wait in a queue; workers take them one after another and
hand each to its topic's handler under the topic's timeout. A worker is added
only while every running one waits, so handlers that return at once share one
task and a handler that waits never holds back the rest. Each outcome is
queued for the settler; a message's slot frees once its outcome is written.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
import time
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel

from outbox.durations import format_duration
from outbox.errors import Dropped, Permanent, RetryAfter, Unavailable
from outbox.message import Message
from outbox.relay.backoff import backoff
from outbox.relay.inflight import Held, InFlight
from outbox.relay.metrics import RelayMetrics
from outbox.relay.routing import Route
from outbox.relay.settle import Settler, clean_reason
from outbox.requests import Acked, Buried, Outcome, Released, Retried
from outbox.tracing import DeliveryTracer

__all__ = ["Deliveries"]

# A handler's deadline may come this share of its timeout early (see _work).
_DEADLINE_SLACK = 0.01


class Deliveries:
    """Hands what a relay claimed to its handlers and queues each outcome.

    ``in_flight`` holds the claimed messages (the relay's claims add to it;
    the settler's writes free them); each outcome goes to ``settler.report``
    once; ``stopping`` tells whether the relay stops (then no new delivery
    starts).
    """

    def __init__(
        self,
        in_flight: InFlight,
        settler: Settler,
        metrics: RelayMetrics,
        *,
        stopping: Callable[[], bool],
        tracer: DeliveryTracer | None = None,
    ) -> None:
        self.in_flight = in_flight
        self.settler = settler
        self.metrics = metrics
        self.tracer = tracer
        self._stopping = stopping
        self._queue: collections.deque[tuple[Held, Route]] = collections.deque()
        self.workers = 0
        """Tasks delivering (workers and key runs): the relay ends once none is left."""

    async def start(self, claimed: list[Message], tg: anyio.abc.TaskGroup) -> None:
        """Queue ``claimed`` and add workers while every running one waits.

        Messages of one key after its first (a claim's run) go to a task of
        their own, which hands them over one after another.
        """
        held = self.in_flight.held
        runs: dict[tuple[str, str], list[Held]] = {}
        # A key (of any topic: runs are grouped by both below) more than once:
        # a run, perhaps. Strings hash once; (topic, key) pairs every time.
        keys = [m.key for m in claimed if m.key is not None]
        if len(set(keys)) < len(keys):
            for m in claimed:
                if m.key is not None:
                    runs.setdefault((m.topic, m.key), []).append(held[m.id])
        for m in claimed:
            if runs and m.key is not None and len(runs[m.topic, m.key]) > 1:
                continue
            h = held[m.id]
            route = self._admit(h)
            if route is not None:
                self._queue.append((h, route))
        for run in runs.values():
            if len(run) > 1:
                for h in run[:-1]:
                    h.followed = True
                tg.start_soon(self._follow, run)
                self.workers += 1
        # Runs whenever every worker waits: then it adds one, so a handler that
        # waits never holds back the rest, while handlers that finish at once
        # share a task.
        while self._queue and not self._stopping():
            tg.start_soon(self._work)
            self.workers += 1
            await anyio.lowlevel.checkpoint()

    def clear(self) -> None:
        """Start nothing more of what is queued (the relay hands it back)."""
        self._queue.clear()

    def _admit(self, held: Held) -> Route | None:
        """``held``'s route, if it goes to its handler; if not, settle it now."""
        m, route = held.message, held.route
        if route is None:  # the registry changed since the claim: let another relay
            self.settler.report(held, Released(m))
            return None
        if m.attempts > route.max_attempts:
            if held.solo:
                reason = (
                    f"claimed {m.attempts} times; delivered alone, it never finished "
                    "(its relay died or stalled): it may crash the relay"
                )
            else:
                reason = f"claimed {m.attempts} times, more than maxAttempts {route.max_attempts}"
            self.settler.report(held, Buried(m, reason))
            return None
        return route

    async def _work(self) -> None:
        # anyio's clock read through time.monotonic(): on asyncio the very same
        # clock, elsewhere a fixed offset; anyio.current_time() costs
        # microseconds a call, and this runs once per message.
        offset = anyio.current_time() - time.monotonic()
        try:
            while self._queue and not self._stopping():
                current: tuple[Held, Route] | None = None
                with anyio.CancelScope() as scope:
                    while self._queue and not self._stopping():
                        current = self._queue.popleft()
                        # Moving a deadline reschedules a timer: skip it while the
                        # one set for an earlier message is at most _DEADLINE_SLACK
                        # of this message's timeout early (never late).
                        route = current[1]
                        due = time.monotonic() + offset + route.seconds
                        if not due - route.seconds * _DEADLINE_SLACK <= scope.deadline <= due:
                            scope.deadline = due
                        await self._deliver(*current)
                        current = None
                        if scope.cancel_called:
                            break
                if current is not None:  # its deadline ran out
                    self._timed_out(*current)
        finally:
            self.workers -= 1
            self.in_flight.signal()

    async def _deliver(self, held: Held, route: Route) -> None:
        """Hand ``held`` to its handler and report the outcome, from this one exit
        (none when cancelled from outside: a timeout or a shutdown decides it)."""
        m = held.message
        span = None if self.tracer is None else self.tracer.start(m)
        outcome: Outcome | None = None
        dropped: str | None = None
        started = time.perf_counter()
        try:
            if span is None:
                await route.handler(m)
            else:
                token = span.enter()
                try:
                    await route.handler(m)
                finally:
                    span.leave(token)
        except Permanent as exc:
            outcome = Buried(m, clean_reason(f"permanent: {exc.reason}"))
        except Dropped as exc:
            outcome, dropped = Acked(m, held.followed), exc.reason
        except RetryAfter as exc:
            outcome = self._failed(held, route, exc.reason, exc.delay)
        except Unavailable as exc:
            # The receiver is at fault, not the message: the attempt is not counted.
            outcome = Retried(m, exc.delay, clean_reason(exc.reason), counted=False)
        except Exception as exc:
            outcome = self._failed(held, route, f"{type(exc).__name__}: {exc}")
        except anyio.get_cancelled_exc_class():
            if anyio.current_effective_deadline() == -math.inf:
                raise  # we are being cancelled: a timeout or a shutdown
            # The handler raised it on its own (a cancelled task inside it).
            outcome = self._failed(held, route, "CancelledError: raised by the handler")
        else:
            outcome = Acked(m, held.followed)
        finally:
            elapsed = time.perf_counter() - started
            if span is None:
                self.metrics.topic(m.topic).duration.observe(elapsed)
            else:
                self.metrics.topic(m.topic).duration.observe(elapsed, span.exemplar())
                span.end(*_traced(outcome, dropped))
        assert outcome is not None  # cancelled from outside, it raised above
        self.settler.report(held, outcome, dropped)

    async def _follow(self, run: list[Held]) -> None:
        """Deliver a key's messages of one claim in order, each only once the one
        before it was acked (its ack written to the store, not just queued).

        A message that fails, or one whose lease has less than a timeout left,
        ends the run: the rest are handed back, due at once, for the key's next
        claim (a retry keeps the key waiting, as for any head).
        """
        try:
            for i, held in enumerate(run):
                if i:
                    route = held.route
                    fresh = route is not None and held.lease_end - time.monotonic() > route.seconds
                    if self._stopping() or not fresh or not run[i - 1].acked:
                        self._hand_over(run[i:])
                        return
                route = self._admit(held)
                if route is None:
                    self._hand_over(run[i + 1 :])
                    return
                with anyio.move_on_after(route.seconds):
                    await self._deliver(held, route)
                if not held.decided:
                    self._timed_out(held, route)
                if i + 1 < len(run):
                    # The ack is in the store before the next starts.
                    await self.settler.settled(held)
        finally:
            self.workers -= 1
            self.in_flight.signal()

    def _hand_over(self, rest: list[Held]) -> None:
        for held in rest:
            if not held.decided:
                self.settler.report(held, Released(held.message))

    def _timed_out(self, held: Held, route: Route) -> None:
        if held.decided:
            return
        if self._stopping():
            self.settler.report(held, Released(held.message))
            return
        timed_out = f"timed out after {format_duration(route.timeout)}"
        self.settler.report(held, self._failed(held, route, timed_out))

    @staticmethod
    def _failed(
        held: Held, route: Route, reason: str, delay: dt.timedelta | None = None
    ) -> Retried | Buried:
        """A retry after ``delay`` (or the backoff), or a burial once no attempt is left."""
        m = held.message
        if m.attempts >= route.max_attempts:
            return Buried(m, clean_reason(f"{reason} (after {m.attempts} attempts)"))
        return Retried(m, delay or backoff(m.attempts), clean_reason(reason))


def _traced(outcome: Outcome | None, dropped: str | None) -> tuple[str, str | None]:
    """The span's outcome and error for a delivery's ``outcome`` (None: interrupted)."""
    match outcome:
        case Acked():
            return ("dropped" if dropped is not None else "acked"), None
        case Retried() | Buried():
            return ("retried" if isinstance(outcome, Retried) else "buried"), outcome.reason
        case _:
            return "interrupted", None
