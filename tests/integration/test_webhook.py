"""The webhook handler kind against a real HTTP server on loopback."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from aiohttp import web

from outbox import NotFound, Store, backoff
from outbox.handlers import HandlerKinds
from outbox.memory import MemoryStore
from outbox.service.settings import WebhookSettings
from outbox.store import TopicSettings
from tests.integration.kinds import T0, TOPIC, KindRelay

SECRET = "whsec-test-0123456789"


class Receiver:
    """An HTTP endpoint that answers with the statuses queued in ``replies``."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.replies: list[tuple[int, dict[str, str]]] = []
        self.stall = False
        self.released = anyio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        if self.stall:
            await self.released.wait()
        status, headers = self.replies.pop(0) if self.replies else (200, {})
        return web.Response(
            status=status, headers=headers, text="bad payload" if status == 400 else "ok"
        )


@asynccontextmanager
async def serving(r: Receiver) -> AsyncIterator[Receiver]:
    """Serve ``r`` on a loopback port; ``r.url`` is its address."""
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield r
    finally:
        r.released.set()
        await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with serving(Receiver()) as r:
        yield r


class Hooked(KindRelay):
    def __init__(self, store: Store[Any], url: str, **config: Any) -> None:
        super().__init__(store, {"order": 42, "total": "9.99"}, **config)
        self.url = url

    async def bind(self, **extra: Any) -> None:
        config = {"url": self.url, "secret_env": "OUTBOX_TEST_WEBHOOK_SECRET", **extra}
        await self.bind_kind("webhook", config)


@pytest.fixture
async def hooked(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hooked]:
    monkeypatch.setenv("OUTBOX_TEST_WEBHOOK_SECRET", SECRET)
    h = Hooked(MemoryStore(), receiver.url)
    await h.bind()
    yield h
    await h.kinds.aclose()


def verify(headers: dict[str, str], body: bytes) -> int:
    """Check the signature as a receiver would; return its timestamp."""
    parts = dict(p.split("=", 1) for p in headers["Outbox-Signature"].split(","))
    expected = hmac.new(SECRET.encode(), parts["t"].encode() + b"." + body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())
    return int(parts["t"])


async def test_posts_the_payload_signed_with_its_id_as_key(
    hooked: Hooked, receiver: Receiver
) -> None:
    m = await hooked.add()

    assert await hooked.relay.drain() == 1

    [(headers, body)] = receiver.requests
    assert body == m.payload
    assert json.loads(body) == {"order": 42, "total": "9.99"}
    assert headers["Content-Type"] == "application/json"
    assert headers["Idempotency-Key"] == str(m.id)
    assert headers["Outbox-Topic"] == TOPIC
    assert headers["Outbox-Attempt"] == "1"
    assert verify(headers, body) == int(T0.timestamp())
    with pytest.raises(NotFound):
        await hooked.store.get(m.id)


async def test_server_error_then_success_delivers_once_after_backoff(
    hooked: Hooked, receiver: Receiver
) -> None:
    receiver.replies = [(500, {})]
    m = await hooked.add()

    await hooked.relay.drain()
    state = await hooked.store.get(m.id)
    assert state.due_at == T0 + backoff(1)
    assert "HTTP 500" in (state.last_error or "")
    hooked.now += backoff(1)
    await hooked.relay.drain()

    keys = [h["Idempotency-Key"] for h, _ in receiver.requests]
    assert keys == [str(m.id), str(m.id)]
    assert [h["Outbox-Attempt"] for h, _ in receiver.requests] == ["1", "2"]
    with pytest.raises(NotFound):
        await hooked.store.get(m.id)


async def test_too_many_requests_honours_retry_after(hooked: Hooked, receiver: Receiver) -> None:
    receiver.replies = [(429, {"Retry-After": "120"})]
    m = await hooked.add()

    await hooked.relay.drain()

    state = await hooked.store.get(m.id)
    assert state.due_at == T0 + dt.timedelta(seconds=120)
    assert "HTTP 429" in (state.last_error or "")


async def test_retry_after_as_a_date(hooked: Hooked, receiver: Receiver) -> None:
    when = (T0 + dt.timedelta(minutes=3)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    receiver.replies = [(503, {"Retry-After": when})]
    m = await hooked.add()

    await hooked.relay.drain()

    assert (await hooked.store.get(m.id)).due_at == T0 + dt.timedelta(minutes=3)


async def test_client_error_is_buried_at_once(hooked: Hooked, receiver: Receiver) -> None:
    receiver.replies = [(400, {})]
    m = await hooked.add()

    await hooked.relay.drain()

    state = await hooked.store.get(m.id)
    assert state.buried_at is not None
    assert state.message.attempts == 1
    assert "HTTP 400" in (state.last_error or "")
    assert "bad payload" in (state.last_error or "")


async def test_slow_receiver_times_out_and_is_retried(hooked: Hooked, receiver: Receiver) -> None:
    await hooked.store.set_topic(
        TopicSettings(
            TOPIC,
            handler="webhook",
            config={"url": receiver.url},
            timeout=dt.timedelta(milliseconds=200),
        ),
        hooked.now,
    )
    receiver.stall = True
    m = await hooked.add()

    await hooked.relay.drain()

    state = await hooked.store.get(m.id)
    assert state.last_error == "timed out after 200ms"
    assert state.buried_at is None


async def test_redelivery_after_a_lost_ack_carries_the_same_key(
    hooked: Hooked, receiver: Receiver
) -> None:
    m = await hooked.add()
    await hooked.relay.refresh_topics()
    [claimed] = await hooked.store.claim(hooked.now, hooked.relay.config.lease, 10)
    await hooked.relay.router.route(TOPIC).handler(claimed)  # type: ignore[misc]
    hooked.now += hooked.relay.config.lease  # that relay died before acking

    await hooked.relay.drain()

    assert [h["Idempotency-Key"] for h, _ in receiver.requests] == [str(m.id)] * 2


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({}, "url"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "https://x.example/h", "secret_env": "lower"}, "secret_env"),
        ({"url": "https://x.example/h", "headers": {"Authorization": "Bearer x"}}, "no secrets"),
        ({"url": "https://x.example/h", "retries": 3}, "retries"),
    ],
)
def test_bad_config_is_refused_with_the_field(config: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        HandlerKinds().mapping["webhook"](config)


def test_an_allowlist_refuses_urls_outside_it() -> None:
    kinds = HandlerKinds(webhook=WebhookSettings(allow="https://billing.internal/, https://crm/"))

    kinds.mapping["webhook"]({"url": "https://billing.internal/hooks/orders"})
    with pytest.raises(ValueError, match="not under OUTBOX_WEBHOOK_ALLOW"):
        kinds.mapping["webhook"]({"url": "https://attacker.example/collect"})
