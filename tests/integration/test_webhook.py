"""The webhook handler kind against a real HTTP server on loopback."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import standardwebhooks

from outbox import NotFound, backoff
from outbox.handlers import HandlerKinds
from outbox.memory import MemoryStore
from outbox.service.settings import WebhookSettings
from outbox.store import TopicSettings
from outbox.webhooks import BadSignature, verify
from tests.integration.hooks import SECRET, SECRET_ENV, Hooked, Receiver, serving
from tests.integration.kinds import T0, TOPIC


@pytest.fixture
async def hooked(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hooked]:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    h = Hooked(MemoryStore(), receiver.url)
    await h.bind()
    yield h
    await h.kinds.aclose()


def signed_at(headers: dict[str, str], body: bytes) -> int:
    """Check the signature as a receiver would; return its timestamp."""
    stamp = int(headers["webhook-timestamp"])
    verify(SECRET, headers, body, now=stamp)
    return stamp


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
    assert headers["webhook-id"] == str(m.id)
    assert signed_at(headers, body) == int(T0.timestamp())
    with pytest.raises(NotFound):
        await hooked.store.get(m.id)


async def test_message_headers_are_sent_and_the_topics_headers_win_over_them(
    hooked: Hooked, receiver: Receiver
) -> None:
    await hooked.bind(headers={"X-Env": "prod"})
    m = await hooked.add(headers={"X-Tenant": "acme", "x-env": "from the producer"})

    assert await hooked.relay.drain() == 1

    [(headers, body)] = receiver.requests
    sent = {name.lower(): value for name, value in headers.items()}
    assert sent["x-tenant"] == "acme"
    assert sent["x-env"] == "prod"
    assert sent["idempotency-key"] == str(m.id)
    assert len(sent) == len(headers), "one of each name"
    assert signed_at(headers, body) == int(T0.timestamp())


@pytest.mark.parametrize("secret", [SECRET, "a plain secret, used as its bytes"])
async def test_the_signature_is_standard_webhooks(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv(SECRET_ENV, secret)
    hooked = Hooked(MemoryStore(), receiver.url)
    hooked.now = dt.datetime.now(dt.UTC)
    await hooked.bind()
    await hooked.add()
    await hooked.relay.drain()
    await hooked.kinds.aclose()
    [(headers, body)] = receiver.requests

    key = secret if secret.startswith("whsec_") else secret.encode()
    assert standardwebhooks.Webhook(key).verify(body, headers) == {"order": 42, "total": "9.99"}
    assert verify(secret, headers, body) == headers["webhook-id"]


def test_a_replay_under_another_id_or_late_fails_verification() -> None:
    from outbox.webhooks import signature_headers

    headers = signature_headers(SECRET, "m-1", 1_000_000, b"{}")

    assert verify(SECRET, headers, b"{}", now=1_000_100) == "m-1"
    with pytest.raises(BadSignature, match="no signature matches"):
        verify(SECRET, {**headers, "webhook-id": "m-2"}, b"{}", now=1_000_100)
    with pytest.raises(BadSignature, match="no signature matches"):
        verify(SECRET, headers, b'{"a":1}', now=1_000_100)
    with pytest.raises(BadSignature, match="tolerance"):
        verify(SECRET, headers, b"{}", now=1_000_400)
    with pytest.raises(BadSignature, match="missing"):
        verify(SECRET, {}, b"{}")


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
    assert state.last_error == f"permanent: webhook: HTTP 400 from {hooked.url.rsplit('/', 1)[0]}"


async def test_reasons_keep_the_receivers_body_and_the_urls_tokens_out(
    hooked: Hooked, receiver: Receiver
) -> None:
    receiver.replies = [(500, {})]
    await hooked.bind(url=receiver.url + "/T000/SECRETPATH?token=abc123")
    m = await hooked.add()

    await hooked.relay.drain()

    reason = (await hooked.store.get(m.id)).last_error or ""
    assert reason == f"ConnectionError: webhook: HTTP 500 from {receiver.url.rsplit('/', 1)[0]}"
    assert receiver.requests[0][0]["Host"].startswith("127.0.0.1")


async def test_an_endless_error_body_is_never_read(hooked: Hooked, receiver: Receiver) -> None:
    receiver.replies = [(500, {"X-Endless": "1"})]
    m = await hooked.add()

    await hooked.relay.drain()

    state = await hooked.store.get(m.id)
    # Read, it would have run into the 2 s deadline instead.
    where = receiver.url.rsplit("/", 1)[0]
    assert state.last_error == f"ConnectionError: webhook: HTTP 500 from {where}"


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_a_failed_attempt_never_followed(
    hooked: Hooked, receiver: Receiver, status: int
) -> None:
    async with serving(Receiver(), host="127.0.0.2") as elsewhere:
        receiver.replies = [(status, {"Location": elsewhere.url})]
        m = await hooked.add()

        await hooked.relay.drain()

        assert elsewhere.requests == []
    state = await hooked.store.get(m.id)
    assert state.buried_at is None
    assert state.due_at == T0 + backoff(1)
    assert f"HTTP {status} from" in (state.last_error or "")
    assert "redirects are not followed" in (state.last_error or "")
    assert len(receiver.requests) == 1


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
    route = hooked.relay.router.route(TOPIC)
    assert route is not None
    await route.handler(claimed)
    hooked.now += hooked.relay.config.lease  # that relay died before acking

    await hooked.relay.drain()

    assert [h["Idempotency-Key"] for h, _ in receiver.requests] == [str(m.id)] * 2


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({}, "url"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "https://x.example/h", "secret_env": "lower"}, "secret_env"),
        ({"url": "https://x.example/h", "secret_env": "OUTBOX_DATABASE_URL"}, "secret_env"),
        ({"url": "https://x.example/h", "secret_env": "OUTBOX_SMTP_PASSWORD"}, "secret_env"),
        ({"url": "https://x.example/h", "retries": 3}, "retries"),
        ({"url": "https://svc:hunter2@x.example/h"}, "credentials"),
        ({"url": "https://x.example/h/..%2f..%2fadmin"}, "encoded slashes"),
        *(
            ({"url": "https://x.example/h", "headers": {name: "x"}}, complaint)
            for name, complaint in [
                ("Authorization", "reserved"),
                ("AUTHORIZATION", "reserved"),
                ("Authorization ", "not an HTTP token"),
                (" Host", "not an HTTP token"),
                ("Host", "reserved"),
                ("Content-Length", "reserved"),
                ("transfer-encoding", "reserved"),
                ("Proxy-Authorization", "reserved"),
                ("Cookie", "reserved"),
                ("Idempotency-Key", "reserved"),
                ("Outbox-Topic", "reserved"),
                ("webhook-signature", "reserved"),
                ("X-Bad\r\nInjected", "not an HTTP token"),
            ]
        ),
        (
            {"url": "https://x.example/h", "headers": {"X-Tenant": "a\r\nHost: b"}},
            "printable ASCII",
        ),
        ({"url": "https://x.example/h", "headers": {"X-Tenant": "a\x00"}}, "printable ASCII"),
    ],
)
def test_bad_config_is_refused_with_the_field(config: dict[str, Any], complaint: str) -> None:
    kinds = HandlerKinds(webhook=WebhookSettings(allow="https://x.example/"))
    with pytest.raises(ValueError, match=complaint):
        kinds.mapping["webhook"](config)


def test_without_an_allowlist_webhooks_may_send_nowhere() -> None:
    with pytest.raises(ValueError, match="OUTBOX_WEBHOOK_ALLOW is empty"):
        HandlerKinds().mapping["webhook"]({"url": "https://billing.internal/hooks"})


@pytest.mark.parametrize(
    "url",
    [
        "https://billing.internal/hooks",
        "https://billing.internal/hooks/",
        "https://BILLING.internal:443/hooks/orders?tenant=7",
        "https://crm/anything",
    ],
)
def test_an_allowlist_admits_its_hosts_and_paths(url: str) -> None:
    kinds = HandlerKinds(
        webhook=WebhookSettings(allow="https://billing.internal/hooks, https://crm")
    )

    kinds.mapping["webhook"]({"url": url})


@pytest.mark.parametrize(
    "url",
    [
        "https://attacker.example/collect",
        "https://billing.internal.evil.example/hooks",
        "https://billing.internal@evil.example/hooks",
        "https://billing.internal:x@evil.example/hooks",
        "https://billing.internal/hooksx",
        "https://billing.internal/other",
        "http://billing.internal/hooks",
        "https://billing.internal:8443/hooks",
        "https://crm.evil.example/",
    ],
)
def test_an_allowlist_compares_parsed_urls_not_strings(url: str) -> None:
    kinds = HandlerKinds(
        webhook=WebhookSettings(allow="https://billing.internal/hooks, https://crm")
    )

    with pytest.raises(ValueError, match=r"not under OUTBOX_WEBHOOK_ALLOW|credentials"):
        kinds.mapping["webhook"]({"url": url})
