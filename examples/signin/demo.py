"""``make demo`` (``python -m examples.signin``): the mail topics end to end, nothing running.

Starts the embedded PostgreSQL (data under OUTBOX_DATA_DIR, default ./.outbox)
and an SMTP server on a loopback port, runs the real use cases for a few
users, relays until the outbox is empty and prints what happened. One user's
mail server refuses the first attempt (retried), one link expires before the
relay reaches it (dropped), one sign-up fails after asking (rolled back, never
sent). Everything it started is stopped before it returns.
"""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import logging
import os
import socket
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from examples.signin.schema import create_schema
from examples.signin.usecases import request_email_change, request_login_link
from outbox import Relay, RelayConfig, system_clock
from outbox.handlers.mail import EMAIL_CHANGE, LOGIN_LINK, LoginLink, mail_handlers
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.service.embedded import EmbeddedPostgres
from outbox.service.settings import SmtpSettings

__all__ = ["main"]

LINKS = "https://app.example.com"
FLAKY = "ben@example.com"


class _Inbox:
    """aiosmtpd handler: keeps every email; refuses FLAKY's first delivery with 451."""

    def __init__(self) -> None:
        self.mails: list[EmailMessage] = []
        self.refused_once = False

    async def handle_RCPT(  # aiosmtpd calls hooks by this name
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address == FLAKY and not self.refused_once:
            self.refused_once = True
            return "451 4.3.2 mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(  # aiosmtpd calls hooks by this name
        self, server: Any, session: Any, envelope: Any
    ) -> str:
        mail = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        if isinstance(mail, EmailMessage):
            self.mails.append(mail)
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _use_cases(store: PostgresStore) -> list[str]:
    now = system_clock()
    story = []
    await request_login_link(store, "ana@example.com", now=now, link_base=LINKS)
    story.append("ana@example.com asks for a sign-in link")
    await request_login_link(store, FLAKY, now=now, link_base=LINKS)
    story.append(f"{FLAKY} asks for a sign-in link (their server says 451 the first time)")
    cem = await request_login_link(store, "cem@example.com", now=now, link_base=LINKS)
    story.append("cem@example.com asks for a sign-in link")
    account = LoginLink.model_validate_json(cem.payload).account_id
    await request_email_change(store, account, "cem@new.example.com", now=now, link_base=LINKS)
    story.append("cem@example.com asks to change their email to cem@new.example.com")
    long_ago = now - dt.timedelta(minutes=20)
    await request_login_link(store, "dia@example.com", now=long_ago, link_base=LINKS)
    story.append("dia@example.com asked for a link 20 minutes ago; it expired unsent")
    try:
        async with store.begin() as conn:
            await request_login_link(store, "eve@example.com", now=now, link_base=LINKS, conn=conn)
            raise RuntimeError("sign-up rejected by a later check")
    except RuntimeError:
        story.append("eve@example.com's sign-up fails after asking: rolled back, nothing stored")
    return story


async def _tour(url: str, smtp: SmtpSettings) -> dict[str, Any]:
    await migrate(url)
    async with connect_pool(url) as pool:
        store = PostgresStore(pool)
        async with pool.connection() as conn:
            await create_schema(conn)
            await conn.execute("TRUNCATE outbox_messages, user_accounts CASCADE")
        story = await _use_cases(store)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM outbox_messages")
            added = (await cur.fetchone() or (0,))[0]

        registry = CollectorRegistry()
        config = RelayConfig.model_validate({"interval": "100ms", "timeout": "10s"})
        relay = Relay(store, mail_handlers(smtp), config, registry=registry)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run)
                while True:
                    async with pool.connection() as conn:
                        cur = await conn.execute("SELECT count(*) FROM outbox_messages")
                        if (await cur.fetchone() or (1,))[0] == 0:
                            break
                    await anyio.sleep(0.1)
                relay.stop()

    def total(name: str, **labels: str) -> int:
        return int(
            sum(
                registry.get_sample_value(name, {"topic": topic, **labels}) or 0
                for topic in (LOGIN_LINK, EMAIL_CHANGE)
            )
        )

    return {
        "story": story,
        "added": added,
        "delivered": total("outbox_delivered_total"),
        "retried": total("outbox_retried_total"),
        "dropped": total("outbox_dropped_total", reason="expired"),
        "buried": total("outbox_buried_total"),
    }


def main() -> int:
    """Run the tour; print a short summary. Returns the exit code."""
    from aiosmtpd.controller import Controller

    logging.basicConfig(level=logging.ERROR)
    started = time.monotonic()
    data_dir = Path(os.environ.get("OUTBOX_DATA_DIR", ".outbox"))
    inbox = _Inbox()
    port = _free_port()
    smtp = SmtpSettings.model_validate(
        {
            "host": "127.0.0.1",
            "port": port,
            "tls": "none",
            "from_address": "noreply@app.example.com",
        }
    )
    print(f"starting embedded PostgreSQL in {data_dir / 'pgdata'} and SMTP on 127.0.0.1:{port}")
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with EmbeddedPostgres(data_dir / "pgdata") as server:
            summary = anyio.run(_tour, server.url, smtp)
    finally:
        controller.stop()
    print("\nwhat the application did (each change and its message in one transaction):")
    for line in summary["story"]:
        print(f"  - {line}")
    print("\nwhat the relay did:")
    for key in ("added", "delivered", "retried", "dropped", "buried"):
        print(f"  {key:<10} {summary[key]}")
    print(f"  {'emails':<10} {len(inbox.mails)} received by the SMTP server")
    if inbox.mails:
        mail = inbox.mails[0]
        print("\none of them, as received:")
        for header in ("From", "To", "Subject", "Date", "Message-ID"):
            print(f"  {header}: {mail[header]}")
    elapsed = time.monotonic() - started
    print(f"\ndone in {elapsed:.1f}s; PostgreSQL and the SMTP server are stopped")
    return 0
