"""The relay: claim due messages under a lease, deliver each, settle the outcome.

Delivery is at least once. A relay can crash after a handler succeeded and
before the ack; the lease then runs out and a relay delivers the message again.
Handlers must make a repeat harmless (the message id is the tool for that).

Outcomes: success acks (one statement per batch); any exception retries at
now + backoff(attempts); :class:`~outbox.errors.Permanent`, the last allowed
attempt, a topic with no handler and a message claimed more often than allowed
without finishing (it may be what crashes the relay) bury.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from outbox.durations import format_duration
from outbox.errors import Dropped, Permanent, RetryAfter, StoreUnavailable
from outbox.message import Message, validate_topic
from outbox.metrics import RelayMetrics
from outbox.routing import Handler, HandlerKind, Route, Router
from outbox.settings import RelayConfig
from outbox.store import Store

__all__ = ["Clock", "Handler", "HandlerKind", "Relay", "backoff", "system_clock"]

log = logging.getLogger("outbox.relay")


Clock = Callable[[], dt.datetime]
"""Returns the current time, timezone-aware. Tests pass one they can move."""

_BACKOFF_CEILING = dt.timedelta(minutes=5)
_REASON_MAX = 2000
# The loop's wait after a failed poll doubles from the interval up to this.
_FAILURE_BACKOFF_CEILING = 30.0
# How long a cancelled poll may spend handing its batch back.
_RELEASE_GRACE = 2.0


def system_clock() -> dt.datetime:
    """The wall clock, in UTC."""
    return dt.datetime.now(dt.UTC)


def backoff(attempt: int) -> dt.timedelta:
    """The wait before retrying a message that failed on its attempt-th try.

    One second, doubling each time, at most five minutes.
    """
    attempt = max(attempt, 1)
    if attempt > 10:
        return _BACKOFF_CEILING
    return min(dt.timedelta(seconds=1 << (attempt - 1)), _BACKOFF_CEILING)


@dataclasses.dataclass(slots=True)
class _Outcomes:
    """What one poll's deliveries came to, settled after the batch."""

    acked: list[Message] = dataclasses.field(default_factory=list)
    failed: list[tuple[Message, str]] = dataclasses.field(default_factory=list)
    buried: list[tuple[Message, str]] = dataclasses.field(default_factory=list)
    released: list[Message] = dataclasses.field(default_factory=list)
    dropped: list[tuple[Message, str]] = dataclasses.field(default_factory=list)
    routes: dict[uuid.UUID, Route] = dataclasses.field(default_factory=dict)
    delays: dict[uuid.UUID, dt.timedelta] = dataclasses.field(default_factory=dict)


class _TopicMetrics:
    """One topic's children of the relay's collectors, looked up once."""

    __slots__ = ("buried", "delivered", "duration", "retried")

    def __init__(self, metrics: RelayMetrics, topic: str) -> None:
        self.delivered = metrics.delivered.labels(topic)
        self.buried = metrics.buried.labels(topic)
        self.retried = metrics.retried.labels(topic)
        self.duration = metrics.duration.labels(topic)


class Relay:
    """Delivers due messages from ``store`` to the handler for each topic."""

    def __init__(
        self,
        store: Store[Any],
        handlers: Mapping[str, Handler],
        config: RelayConfig | None = None,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        kinds: Mapping[str, HandlerKind] | None = None,
    ) -> None:
        for topic in handlers:
            validate_topic(topic)
        self.store = store
        self.handlers = dict(handlers)
        # model_validate skips the environment: RelayConfig's defaults unless
        # the caller loaded one (outbox.settings.load(RelayConfig)).
        self.config = config if config is not None else RelayConfig.model_validate({})
        self.router = Router(self.handlers, kinds or {}, self.config)
        self._routes_until: dt.datetime | None = None
        self.clock = clock or system_clock
        self.metrics = RelayMetrics.of(registry)
        self._by_topic: dict[str, _TopicMetrics] = {}
        # Export every known topic's counters at 0 from the start: increase()
        # needs a sample before the first burial to see it.
        for topic in self.handlers:
            self._metrics(topic)
        self._stopping = False
        self._wake: anyio.Event | None = None
        self._report_by = math.inf

    def stop(self) -> None:
        """Stop claiming. run() returns once the batch in hand is settled.

        Handlers in flight keep their deadline (the timeout); those still
        running then are cancelled and their messages released, due at once,
        so another relay takes them without waiting for the lease to end.
        """
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    @property
    def stopping(self) -> bool:
        """Whether stop() was called."""
        return self._stopping

    def alive(self) -> bool:
        """Whether run()'s loop reported in time: a poll (claim, deliveries up to
        the timeout, settling) or a wait, plus three intervals to spare."""
        return time.monotonic() <= self._report_by

    async def drain(self) -> int:
        """Handle everything due at clock() until nothing is; return how many were handled."""
        total = 0
        while handled := await self.poll():
            total += handled
        return total

    async def run(self) -> None:
        """Poll until stopped or cancelled, waiting ``interval`` when nothing is due.

        A failing store is logged and retried with a capped backoff; it never
        ends the loop.
        """
        cfg = self.config
        interval = cfg.interval.total_seconds()
        slack = 3 * interval
        self._wake = anyio.Event()
        if self._stopping:
            return
        failures = 0
        while not self._stopping:
            self._report_by = time.monotonic() + cfg.timeout.total_seconds() + slack
            try:
                handled = await self.poll()
            except Exception as exc:
                failures += 1
                wait = min(interval * 2**failures, _FAILURE_BACKOFF_CEILING)
                if isinstance(exc, StoreUnavailable):
                    log.warning("poll failed: %s; next try in %.1fs", exc, wait)
                else:
                    log.exception("poll failed; next try in %.1fs", wait)
            else:
                if failures:
                    log.info("store reachable again after %d failed polls", failures)
                    failures = 0
                wait = 0.0 if handled == cfg.batch else interval
            self.last_poll = time.monotonic()
            if wait and not self._stopping:
                self._report_by = time.monotonic() + wait + slack
                with anyio.move_on_after(wait):
                    await self._wake.wait()
        log.info("relay stopped claiming")

    async def refresh_topics(self) -> None:
        """Read the topic registry now (poll() does it at most once an interval)."""
        self.router.update(await self.store.topics())
        self._routes_until = self.clock() + self.config.interval
        for topic in self.router.routes:
            self._metrics(topic)

    async def poll(self) -> int:
        """Claim one batch, deliver it concurrently and settle it; return its size."""
        cfg = self.config
        now = self.clock()
        if self._routes_until is None or now >= self._routes_until:
            await self.refresh_topics()
        claimed = await self.store.claim(now, cfg.lease, cfg.batch, exclude=self.router.exclude)
        if not claimed:
            return 0
        out = _Outcomes()
        try:
            ready = [m for m in claimed if self._admit(m, out)]
            if ready:
                # Every handler of the batch starts now, so one deadline bounds
                # each by its timeout; much cheaper than a scope apiece. Topics
                # with a shorter timeout of their own get a scope of their own.
                longest = max(out.routes[m.id].timeout for m in ready)
                with anyio.move_on_after(longest.total_seconds()) as deadline:
                    queue = collections.deque(ready)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._work, queue, out, longest)
                        # Runs whenever every worker waits: then it adds one, so
                        # a handler that waits never holds back the rest of the
                        # batch, while handlers that finish at once share a task.
                        while queue:
                            await anyio.lowlevel.checkpoint()
                            if queue:
                                tg.start_soon(self._work, queue, out, longest)
                if deadline.cancelled_caught:
                    self._time_out(ready, out)
            await self._settle(out)
        except anyio.get_cancelled_exc_class():
            # Cancelled from outside (a second signal, a caller's scope): give
            # the batch back rather than leave it leased. Delivered messages
            # are gone already and buried ones are skipped.
            with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_GRACE):
                await self.store.release([m.id for m in claimed], self.clock())
            raise
        return len(claimed)

    def _admit(self, m: Message, out: _Outcomes) -> bool:
        """Whether ``m`` goes to its handler; if not, record why it is buried."""
        route = out.routes[m.id] = self.router.route(m.topic)
        if m.attempts > route.max_attempts:
            out.buried.append(
                (m, f"claimed {m.attempts} times without finishing; it may crash the relay")
            )
            return False
        if route.handler is None:
            out.buried.append((m, f"no handler for topic {m.topic}"))
            return False
        return True

    async def _work(
        self, queue: collections.deque[Message], out: _Outcomes, longest: dt.timedelta
    ) -> None:
        while queue:
            m = queue.popleft()
            route = out.routes[m.id]
            if route.timeout < longest:
                with anyio.move_on_after(route.timeout.total_seconds()) as scope:
                    await self._deliver(m, route, out)
                if scope.cancelled_caught:
                    out.failed.append((m, _timed_out(route)))
            else:
                await self._deliver(m, route, out)

    async def _deliver(self, m: Message, route: Route, out: _Outcomes) -> None:
        assert route.handler is not None
        started = time.perf_counter()
        try:
            await route.handler(m)
        except Permanent as exc:
            out.buried.append((m, f"permanent: {exc.reason}"))
        except Dropped as exc:
            out.acked.append(m)
            out.dropped.append((m, exc.reason))
        except RetryAfter as exc:
            out.failed.append((m, exc.reason))
            out.delays[m.id] = exc.delay
        except Exception as exc:
            out.failed.append((m, f"{type(exc).__name__}: {exc}"))
        else:
            out.acked.append(m)
        finally:
            self._metrics(m.topic).duration.observe(time.perf_counter() - started)

    def _time_out(self, ready: list[Message], out: _Outcomes) -> None:
        """Record the handlers the deadline cancelled: failed, or released when stopping."""
        settled = {m.id for m in out.acked}
        settled.update(m.id for m, _ in out.failed)
        settled.update(m.id for m, _ in out.buried)
        unfinished = [m for m in ready if m.id not in settled]
        if self._stopping:
            out.released.extend(unfinished)
            return
        out.failed.extend((m, _timed_out(out.routes[m.id])) for m in unfinished)

    def _metrics(self, topic: str) -> _TopicMetrics:
        found = self._by_topic.get(topic)
        if found is None:
            found = self._by_topic[topic] = _TopicMetrics(self.metrics, topic)
        return found

    async def _settle(self, out: _Outcomes) -> None:
        if out.acked:
            await self.store.ack_many([m.id for m in out.acked])
            dropped = {m.id for m, _ in out.dropped} if out.dropped else ()
            for m in out.acked:
                if m.id not in dropped:
                    self._metrics(m.topic).delivered.inc()
            if log.isEnabledFor(logging.DEBUG):
                for m in out.acked:
                    log.debug("acked message=%s topic=%s attempt=%d", m.id, m.topic, m.attempts)
            for m, reason in out.dropped:
                self.metrics.dropped.labels(m.topic, reason).inc()
                log.info("message dropped: message=%s topic=%s reason=%s", m.id, m.topic, reason)
        now = self.clock()
        if out.released:
            await self.store.release([m.id for m in out.released], now)
            log.info("released %d unfinished messages on stop", len(out.released))
        for m, reason in out.failed:
            if m.attempts >= out.routes[m.id].max_attempts:
                out.buried.append((m, f"{reason} (after {m.attempts} attempts)"))
                continue
            wait = out.delays.get(m.id) or backoff(m.attempts)
            await self.store.retry(m.id, now + wait, reason[:_REASON_MAX])
            self._metrics(m.topic).retried.inc()
            log.warning(
                "delivery failed: message=%s topic=%s attempt=%d retry_in=%s error=%s",
                m.id,
                m.topic,
                m.attempts,
                format_duration(wait),
                reason,
            )
        for m, reason in out.buried:
            await self.store.bury(m.id, reason[:_REASON_MAX], at=now)
            self._metrics(m.topic).buried.inc()
            log.error(
                "message buried: message=%s topic=%s attempt=%d reason=%s",
                m.id,
                m.topic,
                m.attempts,
                reason,
            )


def _timed_out(route: Route) -> str:
    return f"timed out after {format_duration(route.timeout)}"
