"""The relay's pipeline on every backend: slots, per-topic caps, poison isolation, settling."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from outbox import (
    Message,
    NotFound,
    Permanent,
    Relay,
    RelayConfig,
    Store,
    StoreUnavailable,
    new_message,
)
from outbox.requests import Claimed, ClaimRequest
from outbox.store import TopicSettings
from tests.clock import T0
from tests.relay import Harness


class Crash(BaseException):
    """Stands for the relay process dying inside a handler: nothing after it runs."""


class Bench(Harness):
    """A relay over ``store`` with handlers by topic, polling every 10 ms."""

    def __init__(
        self,
        store: Store[Any],
        handlers: dict[str, Callable[[Message], Any]],
        **config: Any,
    ) -> None:
        super().__init__(store, handlers, **{"interval": "10ms", **config})

    async def add(self, topic: str, n: int = 1, **payload: Any) -> list[Message]:
        return await self.put(
            *(new_message(topic, {"i": i, **payload}, self.now) for i in range(n))
        )


async def eventually(what: str, check: Callable[[], Awaitable[bool]], limit: float = 5) -> None:
    """Wait (at most ``limit`` seconds) until ``check()`` holds: the relay runs meanwhile."""
    with anyio.fail_after(limit):
        while True:
            if await check():
                return
            await anyio.sleep(0.005)


async def test_fast_messages_are_acked_while_a_slow_one_holds_its_slot(store: Store[Any]) -> None:
    release = anyio.Event()

    async def slow(m: Message) -> None:
        await release.wait()

    async def fast(m: Message) -> None:
        return None

    bench = Bench(store, {"mail.slow": slow, "mail.fast": fast}, batch=5, timeout="30s")
    [stuck] = await bench.add("mail.slow")
    quick = await bench.add("mail.fast", 40)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.run)
        await eventually("the fast messages to be acked", lambda: bench.gone(quick))
        state = await store.get(stuck.id)
        assert state.leased_until is not None  # still in its handler, still leased
        assert bench.relay.in_flight == 1
        release.set()
        await eventually("the slow one to be acked", lambda: bench.gone([stuck]))
        bench.relay.stop()

    assert bench.metric("outbox_delivered_total", "mail.fast") == 40


class Holding:
    """A handler that holds every message until ``release`` is set, counting how many at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.release = anyio.Event()

    async def __call__(self, m: Message) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        await self.release.wait()
        self.running -= 1


async def test_never_more_in_flight_than_the_slots(store: Store[Any]) -> None:
    handle = Holding()
    bench = Bench(store, {"mail.wait": handle}, batch=4, concurrency=6)
    msgs = await bench.add("mail.wait", 20)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.run)
        await eventually("every slot to fill", lambda: _true(handle.running == 6))
        await anyio.sleep(0.05)  # the relay would claim more here if it could
        assert bench.relay.in_flight == 6
        handle.release.set()
        await eventually("the outbox to empty", lambda: bench.gone(msgs))
        bench.relay.stop()

    assert handle.most == 6


async def _true(value: bool) -> bool:
    return value


async def test_never_more_payload_bytes_in_flight_than_the_budget(store: Store[Any]) -> None:
    handle = Holding()
    # Each payload is a little over 4 KiB: a 10 KiB budget holds three at most
    # (claims stop once the bytes before a message reach it).
    bench = Bench(store, {"files.up": handle}, batch=10, in_flight_bytes=10 * 1024)
    msgs = await bench.add("files.up", 12, blob="x" * 4096)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.run)
        await eventually("the budget to fill", lambda: _true(handle.running == 3))
        await anyio.sleep(0.05)  # the relay would claim more here if it could
        assert bench.relay.in_flight == 3
        handle.release.set()
        await eventually("the outbox to empty", lambda: bench.gone(msgs))
        bench.relay.stop()

    assert handle.most == 3


async def test_claims_grow_while_the_backlog_fills_them_and_shrink_once_it_is_drained(
    store: Store[Any],
) -> None:
    asked: list[int] = []
    claim = store.claim_many

    async def noting(request: ClaimRequest) -> Claimed:
        asked.append(request.limit)
        return await claim(request)

    store.claim_many = noting  # type: ignore[method-assign]

    async def fast(m: Message) -> None:
        return None

    bench = Bench(store, {"mail.fast": fast}, batch=2, concurrency=64)
    msgs = await bench.add("mail.fast", 200)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.run)
        await eventually("the outbox to empty", lambda: bench.gone(msgs))
        late = await bench.add("mail.fast", 1)
        await eventually("the late one to be acked", lambda: bench.gone(late))
        bench.relay.stop()

    # Each came back full while slots were free: twice as many each time.
    assert asked[:4] == [2, 4, 8, 16]
    assert max(asked) <= 64  # never more than the slots
    assert asked[-1] == 2  # the drained backlog's short claim brought it back to the batch
    assert bench.metric("outbox_delivered_total", "mail.fast") == 201


async def test_max_in_flight_keeps_a_hanging_topic_from_taking_every_slot(
    store: Store[Any],
) -> None:
    async def hang(m: Message) -> None:
        await anyio.sleep_forever()

    async def fine(m: Message) -> None:
        return None

    bench = Bench(store, {"hooks.hang": hang, "mail.fine": fine}, batch=5, concurrency=5)
    await store.set_topic(TopicSettings("hooks.hang", max_in_flight=2), T0)
    hanging = await bench.add("hooks.hang", 10)
    healthy = await bench.add("mail.fine", 50)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.run)
        await eventually("the healthy topic to drain", lambda: bench.gone(healthy))
        leased = [(await store.get(m.id)).leased_until is not None for m in hanging]
        assert sum(leased) == 2
        tg.cancel_scope.cancel()


async def test_a_crashing_message_is_found_alone_and_its_batch_mates_are_spared(
    store: Store[Any],
) -> None:
    delivered: list[int] = []

    async def handle(m: Message) -> None:
        if m.json()["poison"]:
            raise Crash
        delivered.append(m.json()["i"])

    innocent = [new_message("mail.x", {"i": i, "poison": False}, T0) for i in range(9)]
    poison = new_message("mail.x", {"i": 99, "poison": True}, T0)
    async with store.begin() as tx:
        await store.add(tx, *innocent[:4], poison, *innocent[4:])
    now = T0
    crashes = 0
    for _ in range(12):
        relay = Relay(
            store,
            {"mail.x": handle},
            RelayConfig.model_validate({"batch": 20, "max_attempts": 3}),
            clock=functools.partial(_at, now),
            registry=CollectorRegistry(),
        )
        try:
            await relay.drain()
        except (Crash, BaseExceptionGroup):  # the "process" died
            crashes += 1
        now += relay.config.lease

    state = await store.get(poison.id)
    assert state.buried_at is not None
    assert "delivered alone, it never finished" in (state.last_error or "")
    assert crashes == 4  # once in its batch, then three times alone
    for m in innocent:
        with pytest.raises(NotFound):
            await store.get(m.id)
    assert sorted(set(delivered)) == list(range(9))


async def test_outcomes_survive_a_store_that_is_briefly_unavailable(store: Store[Any]) -> None:
    flaky = Flaky(store, fail={"settle": 3})

    async def handle(m: Message) -> None:
        if m.json()["i"] == 0:
            raise Permanent("550 no such mailbox")

    bench = Bench(flaky, {"mail.x": handle})
    msgs = await bench.add("mail.x", 5)

    assert await bench.relay.drain() == 5

    assert (await store.get(msgs[0].id)).last_error == "permanent: 550 no such mailbox"
    assert await bench.gone(msgs[1:])
    assert flaky.failed == {"settle": 3}


class Flaky:
    """``store``, but the named methods raise StoreUnavailable their first few calls."""

    def __init__(self, store: Store[Any], fail: dict[str, int]) -> None:
        self.store = store
        self.fail = dict(fail)
        self.failed = dict.fromkeys(fail, 0)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name not in self.fail:
            return method

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            if self.failed[name] < self.fail[name]:
                self.failed[name] += 1
                raise StoreUnavailable("outbox: database unavailable: connection lost")
            return await method(*args, **kwargs)

        return flaky


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("NUL\x00byte", "permanent: NUL\ufffdbyte"),
        ("lone \ud800 half", "permanent: lone \ufffd half"),
        ("pair \ud83d\ude00 joined", "permanent: pair \U0001f600 joined"),
        ("x" * 5000, ("permanent: " + "x" * 5000)[:1999] + "…"),
    ],
    ids=["nul", "lone-surrogate", "surrogate-pair", "long"],
)
async def test_error_text_is_cleaned_before_it_is_stored(
    store: Store[Any], text: str, stored: str
) -> None:
    async def handle(m: Message) -> None:
        raise Permanent(text)

    bench = Bench(store, {"mail.x": handle})
    [m] = await bench.add("mail.x")

    await bench.relay.drain()

    state = await store.get(m.id)
    assert state.last_error == stored
    assert state.buried_at is not None


async def test_a_cancelled_relay_acks_what_it_delivered_before_releasing_the_rest(
    store: Store[Any],
) -> None:
    entered = anyio.Event()

    async def handle(m: Message) -> None:
        if m.json()["i"] == 0:
            entered.set()
            await anyio.sleep_forever()

    bench = Bench(store, {"mail.x": handle}, batch=10, lease="1m")
    msgs = await bench.add("mail.x", 6)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bench.relay.run)
            await entered.wait()
            await eventually("the others' acks", lambda: _true(not bench.relay.settler.pending()))
            tg.cancel_scope.cancel()

    assert await bench.gone(msgs[1:])
    state = await store.get(msgs[0].id)
    assert (state.leased_until, state.message.attempts) == (None, 0)


async def test_a_cancellation_the_handler_raises_itself_is_a_failure(
    store: Store[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def handle(m: Message) -> None:
        raise asyncio.CancelledError  # a task inside the handler was cancelled

    bench = Bench(store, {"mail.x": handle})
    [m] = await bench.add("mail.x")

    await bench.relay.drain()

    state = await store.get(m.id)
    assert state.last_error == "CancelledError: raised by the handler"
    assert state.leased_until is None
    assert "delivery failed" in caplog.text


async def test_plain_def_handlers_run_in_worker_threads(store: Store[Any]) -> None:
    threads: list[str] = []

    def handle(m: Message) -> None:
        threads.append(threading.current_thread().name)
        if m.json()["i"] == 1:
            raise ConnectionError("smtp down")

    bench = Bench(store, {"mail.sync": handle})
    msgs = await bench.add("mail.sync", 3)

    await bench.relay.drain()

    assert len(threads) == 3
    assert threading.main_thread().name not in threads
    assert await bench.gone([msgs[0], msgs[2]])
    assert (await store.get(msgs[1].id)).last_error == "ConnectionError: smtp down"


async def test_a_plain_def_handler_that_outlives_its_timeout_is_retried(
    store: Store[Any],
) -> None:
    done = threading.Event()

    def handle(m: Message) -> None:
        done.wait(5)

    bench = Bench(store, {"mail.sync": handle}, timeout="50ms")
    [m] = await bench.add("mail.sync")

    await bench.relay.drain()
    done.set()

    assert (await store.get(m.id)).last_error == "timed out after 50ms"


async def test_lease_lost_is_logged_without_the_payload(
    store: Store[Any], caplog: pytest.LogCaptureFixture
) -> None:
    go = anyio.Event()

    async def handle(m: Message) -> None:
        await go.wait()
        raise ConnectionError("down")

    bench = Bench(store, {"mail.x": handle}, timeout="1m")
    [m] = await bench.add("mail.x", code="493817")
    caplog.set_level(logging.INFO, logger="outbox")

    async with anyio.create_task_group() as tg:
        tg.start_soon(bench.relay.poll)
        await eventually("the claim", lambda: _true(bench.relay.in_flight == 1))
        bench.now += bench.relay.config.lease
        assert len(await store.claim(bench.now, bench.relay.config.lease, 1)) == 1
        go.set()

    assert bench.metric("outbox_lease_lost_total", "mail.x") == 1
    assert f"lease lost: message={m.id} topic=mail.x" in caplog.text
    assert "493817" not in caplog.text


def _at(instant: dt.datetime) -> dt.datetime:
    """A clock stopped at ``instant``."""
    return instant
