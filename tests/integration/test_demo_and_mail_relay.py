"""The quick start's demo (the example application), and `outbox relay` sending mail."""

from __future__ import annotations

import datetime as dt
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import anyio

from examples.signin import create_schema, request_login_link
from outbox import Message
from outbox.handlers.mail import LoginLink
from outbox.postgres import PostgresStore, connect_pool, migrate
from tests.integration.process import REPO, RelayProcess, outbox_env, query, wait_until
from tests.integration.smtp import PASSWORD, USER, body, self_signed, smtp_server


def ask(conninfo: str, to: str) -> Message:
    """The example application asks for a sign-in link for ``to``."""

    async def go() -> Message:
        async with connect_pool(conninfo, max_size=1) as pool:
            async with pool.connection() as conn:
                await create_schema(conn)
            return await request_login_link(
                PostgresStore(pool),
                to,
                now=dt.datetime.now(dt.UTC),
                link_base="https://shop.example.com",
            )

    return anyio.run(go)


def test_demo_runs_the_mail_story_and_leaves_nothing_running(tmp_path: Path) -> None:
    data = tmp_path / "demo"

    result = subprocess.run(
        [sys.executable, "-m", "examples.signin"],
        env=outbox_env(OUTBOX_DATA_DIR=str(data)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    counts = dict(
        re.findall(r"^  (added|delivered|retried|dropped|buried)\s+(\d+)$", result.stdout, re.M)
    )
    assert counts == {"added": "5", "delivered": "4", "retried": "1", "dropped": "1", "buried": "0"}
    assert "4 received by the SMTP server" in result.stdout
    assert re.search(r"Message-ID: <[0-9a-f-]{36}@app\.example\.com>", result.stdout)
    assert not (data / "pgdata" / "postmaster.pid").exists()


def test_relay_sends_mail_when_smtp_is_configured(pg_conninfo: str, tmp_path: Path) -> None:
    anyio.run(migrate, pg_conninfo)
    with smtp_server() as (inbox, port):
        relay = RelayProcess(
            tmp_path,
            OUTBOX_DATABASE_URL=pg_conninfo,
            OUTBOX_SMTP_HOST="127.0.0.1",
            OUTBOX_SMTP_PORT=str(port),
            OUTBOX_SMTP_TLS="none",
            OUTBOX_SMTP_FROM_ADDRESS="noreply@shop.example.com",
            OUTBOX_SMTP_PASSWORD="smtp-secret-never-logged",
            OUTBOX_LOG_LEVEL="debug",
            OUTBOX_INTERVAL="100ms",
        )
        try:
            relay.wait_ready()
            sent = LoginLink.model_validate_json(ask(pg_conninfo, "pat@example.com").payload)
            wait_until("the email", lambda: len(inbox.mails) == 1)
            relay.signal(signal.SIGTERM)
            assert relay.wait(15) == 0
        finally:
            relay.stop()

    [mail] = inbox.mails
    assert mail["To"] == "pat@example.com"
    assert mail["Message-ID"].endswith("@shop.example.com>")
    assert sent.code in body(mail)
    log = relay.log
    assert "acked message=" in log
    assert sent.code not in log
    assert "smtp-secret-never-logged" not in log


def test_a_wrong_smtp_password_buries_nothing_and_takes_the_relay_out_of_ready(
    pg_conninfo: str, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    wrong = "p@ss w%rd'\"/#wrong"
    smtp = {
        "OUTBOX_DATABASE_URL": pg_conninfo,
        "OUTBOX_SMTP_HOST": "127.0.0.1",
        "OUTBOX_SMTP_TLS": "starttls",
        "OUTBOX_SMTP_CA_FILE": str(cert),
        "OUTBOX_SMTP_USERNAME": USER,
        "OUTBOX_INTERVAL": "100ms",
        "OUTBOX_MAX_ATTEMPTS": "2",
        "OUTBOX_LOG_LEVEL": "debug",
    }
    anyio.run(migrate, pg_conninfo)
    with smtp_server(tls=context) as (inbox, port):
        smtp["OUTBOX_SMTP_PORT"] = str(port)
        relay = RelayProcess(tmp_path, OUTBOX_SMTP_PASSWORD=wrong, **smtp)
        try:
            relay.wait_ready()
            m = ask(pg_conninfo, "quinn@example.com").id
            wait_until("readiness to fail", lambda: relay.status("/readyz") == 503)
            assert "outbox_smtp_up 0.0" in relay.get("/metrics")[1]
            wait_until("a few tries", lambda: relay.log.count("delivery failed") >= 3)
            [(buried, attempts)] = query(
                pg_conninfo,
                f"SELECT buried_at, attempts FROM outbox_messages WHERE id = '{m}'",
            )
            assert (buried, attempts) in {(None, 0), (None, 1)}  # 1 while a try is in flight
            relay.signal(signal.SIGTERM)
            assert relay.wait(15) == 0
        finally:
            relay.stop()
        assert inbox.mails == []

        fixed = RelayProcess(tmp_path, OUTBOX_SMTP_PASSWORD=PASSWORD, **smtp)
        try:
            wait_until("the email", lambda: len(inbox.mails) == 1, timeout=60)
            assert fixed.status("/readyz") == 200
        finally:
            fixed.stop()

    log = relay.log
    assert log.count("is unavailable or refuses this relay's settings") == 1
    for fragment in (wrong, "w%rd", "p@ss"):
        assert fragment not in log
