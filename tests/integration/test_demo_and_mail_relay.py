"""The quick start's demo (the example application), and `outbox relay` sending mail."""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio

from examples.signin import create_schema, request_login_link
from outbox.handlers.mail import LoginLink
from outbox.postgres import PostgresStore, connect_pool, migrate
from tests.integration.process import REPO, RelayProcess, outbox_env, wait_until
from tests.integration.smtp import smtp_server


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

            async def ask() -> LoginLink:
                async with connect_pool(pg_conninfo, max_size=1) as pool:
                    async with pool.connection() as conn:
                        await create_schema(conn)
                    m = await request_login_link(
                        PostgresStore(pool),
                        "pat@example.com",
                        now=dt.datetime.now(dt.UTC),
                        link_base="https://shop.example.com",
                    )
                return LoginLink.model_validate_json(m.payload)

            sent = anyio.run(ask)
            wait_until("the email", lambda: len(inbox.mails) == 1)
            relay.signal(signal.SIGTERM)
            assert relay.wait(15) == 0
        finally:
            relay.stop()

    [mail] = inbox.mails
    assert mail["To"] == "pat@example.com"
    assert mail["Message-ID"].endswith("@shop.example.com>")
    assert sent.code in mail.get_body(("plain",)).get_content()
    log = relay.log
    assert "acked message=" in log
    assert sent.code not in log
    assert "smtp-secret-never-logged" not in log
