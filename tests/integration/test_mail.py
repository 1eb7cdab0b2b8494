"""Mail topics end to end: use cases, the outbox, the relay and a real SMTP server."""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from examples.signin import (
    confirm_email_change,
    create_schema,
    redeem_login_code,
    request_email_change,
    request_login_link,
)
from examples.signin.errors import EmailTaken, InvalidCode, InvalidToken, UnknownAccount
from outbox import NotFound, Relay, RelayConfig, Unavailable, backoff, new_message
from outbox.handlers.mail import EMAIL_CHANGE, LOGIN_LINK, LoginLink, SmtpSender, mail_handlers
from outbox.postgres import PostgresStore
from outbox.relay.routing import as_async
from outbox.service.settings import SmtpSettings
from tests.integration.smtp import (
    PASSWORD,
    USER,
    Inbox,
    body,
    free_port,
    self_signed,
    smtp_server,
)

T0 = dt.datetime(2026, 5, 1, 9, 0, tzinfo=dt.UTC)
BASE = "https://app.example.com"


class Mail:
    """A relay with the mail handlers over ``store``, its clock at ``now``."""

    def __init__(self, store: PostgresStore, settings: SmtpSettings) -> None:
        self.store = store
        self.now = T0
        self.registry = CollectorRegistry()
        self.handlers = mail_handlers(settings, clock=lambda: self.now)
        self.relay = Relay(
            store,
            self.handlers,
            RelayConfig.model_validate({"timeout": "10s"}),
            clock=lambda: self.now,
            registry=self.registry,
        )

    async def drain(self) -> int:
        return await self.relay.drain()

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def smtp_settings(port: int, **more: Any) -> SmtpSettings:
    values = {
        "host": "127.0.0.1",
        "port": port,
        "tls": "none",
        "from_address": "noreply@app.example.com",
        "timeout": "5s",
        **more,
    }
    return SmtpSettings.model_validate(values)


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


@pytest.fixture
async def app_store(pg_store: PostgresStore) -> PostgresStore:
    """The store, with the example application's own tables beside the outbox."""
    async with pg_store.pool.connection() as conn:
        await create_schema(conn)
    return pg_store


@pytest.fixture
def mail(app_store: PostgresStore, inbox: tuple[Inbox, int]) -> Mail:
    return Mail(app_store, smtp_settings(inbox[1]))


async def test_committed_login_link_sends_exactly_one_email(
    mail: Mail, inbox: tuple[Inbox, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outbox")
    m = await request_login_link(mail.store, "Ana@Example.com", now=T0, link_base=BASE)
    code = LoginLink.model_validate_json(m.payload).code

    assert await mail.drain() == 1

    [sent] = inbox[0].mails
    assert sent["To"] == "Ana@Example.com"
    assert sent["From"] == "noreply@app.example.com"
    assert sent["Message-ID"] == f"<{m.id}@app.example.com>"
    text = body(sent)
    html = body(sent, "html")
    assert f"{BASE}/login?email=Ana%40Example.com&code={code}" in text
    assert code in text
    assert code in html
    assert mail.metric("outbox_delivered_total", topic=LOGIN_LINK) == 1
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("outbox"))
    assert str(m.id) in ours
    assert code not in ours
    assert await redeem_login_code(mail.store, "ana@example.com", code, now=T0) is not None


async def test_rolled_back_use_case_stores_nothing_and_sends_nothing(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    with pytest.raises(RuntimeError, match="signup failed"):
        async with mail.store.begin() as conn:
            m = await request_login_link(
                mail.store, "ben@example.com", now=T0, link_base=BASE, conn=conn
            )
            raise RuntimeError("signup failed")

    assert await mail.drain() == 0
    with pytest.raises(NotFound):
        await mail.store.get(m.id)
    assert inbox[0].mails == []
    async with mail.store.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM user_accounts")
        assert (await cur.fetchone() or [None])[0] == 0


async def test_email_change_mails_a_confirmation_to_the_new_address(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    first = await request_login_link(mail.store, "cem@example.com", now=T0, link_base=BASE)
    account = LoginLink.model_validate_json(first.payload).account_id
    m = await request_email_change(
        mail.store, account, "cem@new.example.com", now=T0, link_base=BASE
    )

    await mail.drain()

    change = next(x for x in inbox[0].mails if x["Message-ID"] == f"<{m.id}@app.example.com>")
    assert change["To"] == "cem@new.example.com"
    text = body(change)
    assert "cem@example.com" in text
    token = text.split("token=", 1)[1].split()[0]
    assert await confirm_email_change(mail.store, token, now=T0) == (account, "cem@new.example.com")
    with pytest.raises(InvalidToken):
        await confirm_email_change(mail.store, token, now=T0)


async def test_redelivery_after_a_lost_ack_carries_the_same_message_id(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    m = await request_login_link(mail.store, "dia@example.com", now=T0, link_base=BASE)
    lease = mail.relay.config.lease
    # A relay sends the email, then dies before it acks.
    [claimed] = await mail.store.claim(mail.now, lease, 10)
    await as_async(mail.handlers[LOGIN_LINK])(claimed)
    mail.now += lease

    assert await mail.drain() == 1

    ids = [x["Message-ID"] for x in inbox[0].mails]
    assert ids == [f"<{m.id}@app.example.com>"] * 2


async def test_expired_link_is_dropped_and_counted(mail: Mail, inbox: tuple[Inbox, int]) -> None:
    m = await request_login_link(
        mail.store, "eve@example.com", now=T0, link_base=BASE, ttl=dt.timedelta(minutes=15)
    )
    mail.now = T0 + dt.timedelta(minutes=16)

    assert await mail.drain() == 1

    assert inbox[0].mails == []
    with pytest.raises(NotFound):
        await mail.store.get(m.id)
    assert mail.metric("outbox_dropped_total", topic=LOGIN_LINK, reason="expired") == 1
    assert mail.metric("outbox_delivered_total", topic=LOGIN_LINK) == 0


async def test_smtp_server_down_is_retried_and_delivered_when_it_returns(
    app_store: PostgresStore,
) -> None:
    port = free_port()
    mail = Mail(app_store, smtp_settings(port))
    m = await request_login_link(app_store, "fay@example.com", now=T0, link_base=BASE)

    await mail.drain()
    state = await app_store.get(m.id)
    assert "SMTPConnectError" in (state.last_error or "")
    assert state.due_at == T0 + dt.timedelta(seconds=1)
    assert state.message.attempts == 0  # the server is down, not the message at fault

    with smtp_server(port) as (inbox, _):
        mail.now += dt.timedelta(seconds=1)
        await mail.drain()

    assert [x["Message-ID"] for x in inbox.mails] == [f"<{m.id}@app.example.com>"]
    assert mail.metric("outbox_retried_total", topic=LOGIN_LINK) == 1


async def test_temporary_refusal_is_retried(mail: Mail, inbox: tuple[Inbox, int]) -> None:
    inbox[0].refuse["gil@example.com"] = ["451 4.3.0 try again later"]
    m = await request_login_link(mail.store, "gil@example.com", now=T0, link_base=BASE)

    await mail.drain()
    assert "451" in ((await mail.store.get(m.id)).last_error or "")
    mail.now += backoff(1)
    await mail.drain()

    assert len(inbox[0].mails) == 1


async def test_permanent_refusal_is_buried_with_the_servers_reply(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    inbox[0].refuse["hal@example.com"] = ["550 5.1.1 no such mailbox"]
    m = await request_login_link(mail.store, "hal@example.com", now=T0, link_base=BASE)

    await mail.drain()

    state = await mail.store.get(m.id)
    assert state.buried_at is not None
    assert state.message.attempts == 1
    assert "550 5.1.1 no such mailbox" in (state.last_error or "")
    assert inbox[0].mails == []


async def test_a_refused_sender_address_waits_for_the_settings_to_be_fixed(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    inbox[0].sender = "553 5.7.1 sender address not allowed"
    m = await request_login_link(mail.store, "ida@example.com", now=T0, link_base=BASE)

    await mail.drain()

    state = await mail.store.get(m.id)
    assert state.buried_at is None
    assert state.message.attempts == 0
    assert "553 5.7.1" in (state.last_error or "")

    inbox[0].sender = None
    mail.now += dt.timedelta(seconds=1)
    await mail.drain()
    assert [x["Message-ID"] for x in inbox[0].mails] == [f"<{m.id}@app.example.com>"]


async def test_content_refused_with_5xx_is_buried(mail: Mail, inbox: tuple[Inbox, int]) -> None:
    inbox[0].data = "554 5.6.0 message content rejected"
    m = await request_login_link(mail.store, "jon@example.com", now=T0, link_base=BASE)

    await mail.drain()

    state = await mail.store.get(m.id)
    assert state.buried_at is not None
    assert "554 5.6.0 message content rejected" in (state.last_error or "")


async def test_an_unavailable_server_is_retried_as_long_again_as_it_has_been_down(
    inbox: tuple[Inbox, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="outbox")
    clock = [100.0]
    sender = SmtpSender(smtp_settings(free_port()), monotonic=lambda: clock[0])
    mail = EmailMessage()
    mail["From"] = "noreply@app.example.com"
    mail["To"] = "kai@example.com"
    mail.set_content("hi")

    waits = []
    for step in (0, 0, 3, 10, 1000):
        clock[0] += step
        with pytest.raises(Unavailable) as raised:
            await sender.send(mail)
        waits.append(raised.value.delay.total_seconds())
    assert waits == [1, 1, 3, 13, 300]
    assert sender.up is False
    assert sum("unavailable" in r.getMessage() for r in caplog.records) == 1

    sender.settings = smtp_settings(inbox[1])
    await sender.send(mail)
    assert sender.up is True
    assert len(inbox[0].mails) == 1
    assert any("reachable again after 5 failures" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "to",
    [
        "ivy@example.com\r\nBcc: all@example.com",
        "ivy@example.com\n",
        "victim@example.com,attacker@evil.example",
        "victim@example.com; attacker@evil.example",
        "Victim <victim@example.com>, attacker@evil.example",
    ],
)
async def test_anything_but_one_address_is_refused_and_buried(
    mail: Mail, inbox: tuple[Inbox, int], to: str
) -> None:
    # Written by a producer that skipped the payload model, as another service might.
    payload = {
        "account_id": "0191c0ae-0000-7000-8000-000000000000",
        "to": to,
        "link": f"{BASE}/login",
        "code": "123456",
        "expires_at": (T0 + dt.timedelta(hours=1)).isoformat(),
    }
    m = new_message(LOGIN_LINK, payload, T0)
    async with mail.store.begin() as conn:
        await mail.store.add(conn, m)

    await mail.drain()

    state = await mail.store.get(m.id)
    assert state.buried_at is not None
    assert state.last_error == "permanent: payload is not a valid LoginLink (fields: to)"
    assert "123456" not in (state.last_error or "")
    assert inbox[0].mails == []


def test_the_payload_model_takes_one_address_only() -> None:
    with pytest.raises(ValueError, match="to"):
        LoginLink(
            account_id="0191c0ae-0000-7000-8000-000000000000",  # type: ignore[arg-type]
            to="a@example.com,b@example.com",
            link=f"{BASE}/login",
            code="123456",
            expires_at=T0,
        )


async def test_invalid_payload_is_buried_without_quoting_it(
    mail: Mail, inbox: tuple[Inbox, int]
) -> None:
    m = new_message(EMAIL_CHANGE, {"to": "x@example.com", "code": "765432"}, T0)
    async with mail.store.begin() as conn:
        await mail.store.add(conn, m)

    await mail.drain()

    reason = (await mail.store.get(m.id)).last_error or ""
    assert "not a valid EmailChange" in reason
    assert "765432" not in reason


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


async def test_starttls_and_auth(app_store: PostgresStore, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with smtp_server(tls=context) as (inbox, port):
        good = Mail(
            app_store,
            smtp_settings(port, tls="starttls", ca_file=cert, username=USER, password=PASSWORD),
        )
        bad = Mail(
            app_store,
            smtp_settings(port, tls="starttls", ca_file=cert, username=USER, password="wrong"),
        )
        m1 = await request_login_link(app_store, "jo@example.com", now=T0, link_base=BASE)
        await good.drain()
        m2 = await request_login_link(
            app_store, "kim@example.com", now=T0, link_base=BASE, ttl=dt.timedelta(days=1)
        )
        for _ in range(12):  # more tries than max_attempts allows
            await bad.drain()
            bad.now += dt.timedelta(minutes=10)

        # A wrong password is the relay's fault, not the message's: it waits.
        state = await app_store.get(m2.id)
        assert state.buried_at is None
        assert state.message.attempts == 0
        assert "535" in (state.last_error or "")
        assert "wrong" not in (state.last_error or "")
        assert bad.handlers is not good.handlers

        good.now = bad.now
        await good.drain()

    assert [x["Message-ID"] for x in inbox.mails] == [
        f"<{m1.id}@app.example.com>",
        f"<{m2.id}@app.example.com>",
    ]
    assert inbox.logins == [USER.encode()] * 2


async def test_login_codes_work_once_and_expire(app_store: PostgresStore) -> None:
    m = await request_login_link(app_store, "lee@example.com", now=T0, link_base=BASE)
    code = LoginLink.model_validate_json(m.payload).code
    later = T0 + dt.timedelta(minutes=15)

    with pytest.raises(InvalidCode):
        await redeem_login_code(app_store, "lee@example.com", code, now=later)
    with pytest.raises(InvalidCode):
        await redeem_login_code(
            app_store, "lee@example.com", "000000" if code != "000000" else "1", now=T0
        )
    account = await redeem_login_code(app_store, "LEE@example.com", code, now=T0)
    assert account == LoginLink.model_validate_json(m.payload).account_id
    with pytest.raises(InvalidCode):
        await redeem_login_code(app_store, "lee@example.com", code, now=T0)


async def test_email_change_refuses_taken_addresses_and_unknown_accounts(
    app_store: PostgresStore,
) -> None:
    a = await request_login_link(app_store, "mo@example.com", now=T0, link_base=BASE)
    await request_login_link(app_store, "ned@example.com", now=T0, link_base=BASE)
    account = LoginLink.model_validate_json(a.payload).account_id

    with pytest.raises(EmailTaken):
        await request_email_change(app_store, account, "NED@example.com", now=T0, link_base=BASE)
    with pytest.raises(UnknownAccount):
        await request_email_change(
            app_store, new_message("a", {}, T0).id, "x@example.com", now=T0, link_base=BASE
        )
    for wrong in ("no-at-sign", "victim@example.com,attacker@evil.example", "a <b@c.example>"):
        with pytest.raises(ValueError, match="not an email address"):
            await request_login_link(app_store, wrong, now=T0, link_base=BASE)


async def test_implicit_tls(app_store: PostgresStore, certificate: tuple[Path, Path]) -> None:
    from aiosmtpd.controller import Controller

    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, ssl_context=context)
    controller.start()
    try:
        mail = Mail(app_store, smtp_settings(port, tls="tls", ca_file=cert))
        m = await request_login_link(app_store, "quinn@example.com", now=T0, link_base=BASE)
        await mail.drain()
    finally:
        controller.stop()

    assert [x["Message-ID"] for x in inbox.mails] == [f"<{m.id}@app.example.com>"]
