"""The relay's behaviour on every backend, driven by an injected clock: no sleeps."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from outbox import (
    Message,
    NotFound,
    Permanent,
    Relay,
    Store,
    Unavailable,
    backoff,
    new_message,
)
from outbox.requests import ClaimRequest, Orphans
from tests.clock import T0
from tests.relay import Harness


class Fixture(Harness):
    """A relay over ``store`` whose handler is ``self.handle``."""

    def __init__(self, store: Store[Any], **config: Any) -> None:
        self.handle: Callable[[Message], Awaitable[None]] = self._ok
        super().__init__(store, {"mail": self._dispatch, "mail.other": self._dispatch}, **config)

    async def _ok(self, m: Message) -> None:
        pass

    async def _dispatch(self, m: Message) -> None:
        await self.handle(m)

    async def add(self, topic: str = "mail", **payload: Any) -> Message:
        return await self.add_one(topic, payload)

    async def drain(self) -> int:
        return await self.relay.drain()

    def metric(self, name: str, topic: str = "mail") -> float:
        return super().metric(name, topic)


@pytest.fixture
def f(store: Store[Any]) -> Fixture:
    return Fixture(store)


async def test_relay_retries_until_delivered(f: Fixture) -> None:
    calls: list[int] = []
    delivered: list[Any] = []

    async def handle(m: Message) -> None:
        calls.append(m.attempts)
        if len(calls) < 3:
            raise ConnectionRefusedError("smtp: connection refused")
        delivered.append(m.id)

    f.handle = handle
    m = await f.add()

    await f.drain()  # fails, retry in 1s
    await f.drain()  # not due yet
    f.now += backoff(1)
    await f.drain()  # fails, retry in 2s
    f.now += backoff(2)
    await f.drain()  # succeeds
    f.now += dt.timedelta(hours=1)
    await f.drain()  # nothing left

    assert calls == [1, 2, 3]
    assert delivered == [m.id]
    assert f.metric("outbox_delivered_total") == 1
    assert f.metric("outbox_retried_total") == 2
    assert f.metric("outbox_buried_total") == 0


async def test_failed_delivery_keeps_error_as_reason(f: Fixture) -> None:
    async def handle(m: Message) -> None:
        raise ConnectionRefusedError("smtp: connection refused")

    f.handle = handle
    m = await f.add()

    assert await f.drain() == 1

    state = await f.store.get(m.id)
    assert state.last_error == "ConnectionRefusedError: smtp: connection refused"
    assert state.due_at == T0 + backoff(1)
    assert state.buried_at is None


async def test_drain_returns_how_many_it_handled(f: Fixture) -> None:
    for i in range(25):
        await f.add(n=i)

    assert await f.drain() == 25
    assert await f.drain() == 0
    assert f.metric("outbox_delivered_total") == 25


async def test_topic_without_handler_is_buried_after_the_grace_without_calling_anything(
    f: Fixture,
) -> None:
    called: list[Message] = []

    async def handle(m: Message) -> None:
        called.append(m)

    f.handle = handle
    m = await f.add("billing.invoice")

    await f.drain()  # the first sweep notes the topic as unserved
    f.now += f.relay.config.unserved_grace - dt.timedelta(seconds=1)
    await f.drain()
    assert (await f.store.get(m.id)).buried_at is None
    f.now += f.relay.fleet.sweep_every  # the next sweep is at most this far off
    await f.drain()

    state = await f.store.get(m.id)
    assert state.buried_at == f.now
    assert state.last_error == (
        "no handler for topic billing.invoice (no live relay served it for 10m)"
    )
    assert state.message.attempts == 0
    assert called == []
    # A topic nobody serves or registers is no label value: it counts under _other.
    assert f.metric("outbox_buried_total", "_other") == 1
    assert f.registry.get_sample_value("outbox_buried_total", {"topic": "billing.invoice"}) is None


async def test_permanent_error_buries_at_once(f: Fixture) -> None:
    async def handle(m: Message) -> None:
        raise Permanent("550 5.1.1 no such mailbox")

    f.handle = handle
    m = await f.add()

    await f.drain()

    state = await f.store.get(m.id)
    assert state.buried_at is not None
    assert state.message.attempts == 1
    assert state.last_error == "permanent: 550 5.1.1 no such mailbox"


async def test_an_unavailable_receiver_is_retried_without_counting_the_attempt(
    store: Store[Any],
) -> None:
    f = Fixture(store, max_attempts=3)
    calls: list[int] = []

    async def handle(m: Message) -> None:
        calls.append(m.attempts)
        if len(calls) <= 6:
            raise Unavailable(dt.timedelta(seconds=30), "smtp: 535 authentication failed")
        raise RuntimeError("then a failure of this message")

    f.handle = handle
    m = await f.add()

    for _ in range(6):
        await f.drain()
        state = await f.store.get(m.id)
        assert state.due_at == f.now + dt.timedelta(seconds=30)
        assert state.message.attempts == 0
        f.now += dt.timedelta(seconds=30)
    await f.drain()

    assert calls == [1] * 7  # each try is the first, as far as max_attempts goes
    state = await f.store.get(m.id)
    assert state.buried_at is None
    assert state.message.attempts == 1
    assert f.metric("outbox_retried_total") == 7
    assert f.metric("outbox_buried_total") == 0


async def test_message_is_buried_once_attempts_reach_max_attempts(store: Store[Any]) -> None:
    f = Fixture(store, max_attempts=3)
    calls: list[int] = []

    async def handle(m: Message) -> None:
        calls.append(m.attempts)
        raise RuntimeError(f"failure {m.attempts}")

    f.handle = handle
    m = await f.add()

    for _ in range(5):
        await f.drain()
        f.now += dt.timedelta(minutes=10)

    assert calls == [1, 2, 3]
    state = await f.store.get(m.id)
    assert state.buried_at is not None
    assert state.last_error == "RuntimeError: failure 3 (after 3 attempts)"
    assert f.metric("outbox_retried_total") == 2
    assert f.metric("outbox_buried_total") == 1


async def test_message_that_keeps_dying_alone_is_buried_unread(store: Store[Any]) -> None:
    f = Fixture(store, max_attempts=2)
    called: list[Message] = []

    async def handle(m: Message) -> None:
        called.append(m)

    f.handle = handle
    m = await f.add()
    lease = f.relay.config.lease
    # Relays took the message and died before settling it: first alongside
    # others (not counted), then twice on its own (counted).
    assert len(await store.claim(f.now, lease, 10)) == 1
    for attempts in (1, 2):
        f.now += lease
        [again] = (
            await store.claim_many(
                ClaimRequest(now=f.now, lease=lease, limit=1, orphans=Orphans.ONLY)
            )
        ).messages
        assert again.attempts == attempts
    f.now += lease

    await f.drain()

    assert called == []
    state = await store.get(m.id)
    assert state.buried_at is not None
    assert state.last_error == (
        "claimed 3 times; delivered alone, it never finished (its relay died or stalled): "
        "it may crash the relay"
    )


async def test_handler_that_outlives_timeout_is_retried(store: Store[Any]) -> None:
    f = Fixture(store, timeout="50ms")
    never = anyio.Event()

    async def handle(m: Message) -> None:
        await never.wait()

    f.handle = handle
    m = await f.add()

    await f.drain()

    state = await store.get(m.id)
    assert state.last_error == "timed out after 50ms"
    assert state.due_at == T0 + backoff(1)
    assert f.metric("outbox_retried_total") == 1


async def test_batch_handlers_run_concurrently(store: Store[Any]) -> None:
    f = Fixture(store, batch=5, timeout="5s", lease="10s")
    started = 0
    all_started = anyio.Event()

    async def handle(m: Message) -> None:
        nonlocal started
        started += 1
        if started == 5:
            all_started.set()
        await all_started.wait()  # deadlocks (then times out) unless all run at once

    f.handle = handle
    for i in range(5):
        await f.add(n=i)

    await f.drain()

    assert f.metric("outbox_delivered_total") == 5


async def test_one_failure_does_not_hold_back_the_rest_of_the_batch(f: Fixture) -> None:
    async def handle(m: Message) -> None:
        if m.json()["n"] == 2:
            raise ValueError("bad")

    f.handle = handle
    msgs = [await f.add(n=i) for i in range(4)]

    await f.drain()

    for i, m in enumerate(msgs):
        if i == 2:
            assert (await f.store.get(m.id)).last_error == "ValueError: bad"
        else:
            with pytest.raises(NotFound):
                await f.store.get(m.id)


async def test_metrics_are_counted_per_topic(f: Fixture) -> None:
    await f.add("mail")
    await f.add("mail.other")
    await f.add("mail.other")

    await f.drain()

    assert f.metric("outbox_delivered_total", "mail") == 1
    assert f.metric("outbox_delivered_total", "mail.other") == 2
    assert f.metric("outbox_delivery_duration_seconds_count", "mail.other") == 2


async def test_logs_name_message_but_never_payload(
    f: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    async def handle(m: Message) -> None:
        raise RuntimeError("mail server said no")

    f.handle = handle
    m = await f.add(code="493817", to="someone@example.com")
    caplog.set_level(logging.DEBUG, logger="outbox")

    await f.drain()

    assert str(m.id) in caplog.text
    assert "attempt=1" in caplog.text
    assert "493817" not in caplog.text
    assert "someone@example.com" not in caplog.text


def hang(f: Fixture) -> anyio.Event:
    """Make ``f``'s handler never finish; the event is set once it has started."""
    started = anyio.Event()

    async def handle(m: Message) -> None:
        started.set()
        await anyio.Event().wait()

    f.handle = handle
    return started


async def run_until(relay: Relay, started: anyio.Event, then: Callable[[], None]) -> None:
    """Run the relay's loop; once ``started`` is set call ``then``; return when run() does."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        with anyio.fail_after(5):
            await started.wait()
        then()


async def test_stop_lets_in_flight_handlers_finish(store: Store[Any]) -> None:
    f = Fixture(store, interval="10ms")
    started, release = anyio.Event(), anyio.Event()

    async def handle(m: Message) -> None:
        started.set()
        await release.wait()

    f.handle = handle
    m = await f.add()

    def stop_then_finish() -> None:
        f.relay.stop()
        release.set()

    with anyio.fail_after(5):
        await run_until(f.relay, started, stop_then_finish)

    with pytest.raises(NotFound):
        await store.get(m.id)
    assert f.relay.stopping


async def test_stop_releases_what_outlives_the_deadline(store: Store[Any]) -> None:
    f = Fixture(store, interval="10ms", timeout="100ms", lease="10s")
    started = hang(f)
    m = await f.add()

    with anyio.fail_after(5):
        await run_until(f.relay, started, f.relay.stop)

    state = await store.get(m.id)
    assert state.leased_until is None
    assert state.due_at == f.now
    assert state.message.attempts == 0
    assert f.metric("outbox_retried_total") == 0


async def test_cancelling_the_loop_hands_the_batch_back(store: Store[Any]) -> None:
    f = Fixture(store, interval="10ms", lease="1m")
    started = hang(f)
    m = await f.add()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(f.relay.run)
            await started.wait()
            tg.cancel_scope.cancel()

    state = await store.get(m.id)
    assert state.leased_until is None
    assert state.message.attempts == 0


async def test_loop_reports_alive_while_it_polls(store: Store[Any]) -> None:
    f = Fixture(store, interval="10ms")
    delivered = anyio.Event()

    async def handle(m: Message) -> None:
        delivered.set()

    f.handle = handle
    await f.add()

    with anyio.fail_after(5):
        await run_until(f.relay, delivered, f.relay.stop)

    assert f.relay.alive()


async def test_a_message_is_not_delivered_before_its_deliver_at(f: Fixture) -> None:
    m = new_message("mail", {"n": 1}, f.now, deliver_at=f.now + dt.timedelta(minutes=5))
    async with f.store.begin() as tx:
        await f.store.add(tx, m)

    assert await f.drain() == 0
    f.now += dt.timedelta(minutes=5)
    assert await f.drain() == 1
    assert f.metric("outbox_delivered_total") == 1


async def test_a_payload_that_does_not_fit_its_model_is_buried_with_the_reason(f: Fixture) -> None:
    @dataclasses.dataclass
    class Welcome:
        to: str

    async def handle(m: Message) -> None:
        m.decode(Welcome)

    f.handle = handle
    m = await f.add(recipient="ana@example.com")

    await f.drain()

    state = await f.store.get(m.id)
    assert state.buried_at is not None
    assert (state.last_error or "").startswith("permanent: payload of mail does not fit Welcome")
    assert state.message.attempts == 1
