"""A relay cut off from PostgreSQL by a partition (packets dropped, no reset)
while its claim is in the server: it gives up on the lost answer within
seconds, reports not ready but alive, and delivers again soon after the heal."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import RelayProcess, run_outbox, wait_until
from tests.integration.servers import primary
from tests.tools import require, require_root

CUT_OFF = "127.0.0.2"  # the relay's address for the server; the test's stays 127.0.0.1
PARTITION = 15.0
"""Longer than libpq's tcp_user_timeout (10 s) and the store's deadline (10 s)."""


@contextmanager
def partition(port: int) -> Iterator[None]:
    """Drop every packet between CUT_OFF and ``port``, both ways, until the block ends."""
    iptables = require("iptables", "iptables")
    require_root("dropping packets with iptables")
    rules = [
        ["INPUT", "-i", "lo", "-p", "tcp", "-d", CUT_OFF, "--dport", str(port), "-j", "DROP"],
        ["INPUT", "-i", "lo", "-p", "tcp", "-s", CUT_OFF, "--sport", str(port), "-j", "DROP"],
    ]
    for rule in rules:
        subprocess.run([iptables, "-I", *rule], check=True)
    try:
        yield
    finally:
        for rule in rules:
            subprocess.run([iptables, "-D", *rule], check=True)


def _add(url: str) -> str:
    m = new_message(recording.TOPIC, {})
    with psycopg.connect(url) as conn, conn.transaction():
        add_sync(conn, m)
    return str(m.id)


def test_a_relay_partitioned_mid_claim_delivers_again_soon_after_the_heal(
    tmp_path: Path, relays: list[RelayProcess]
) -> None:
    starts = tmp_path / "starts"
    with primary(listen=f"127.0.0.1,{CUT_OFF}") as server:
        url = server.url()
        assert run_outbox("migrate", OUTBOX_DATABASE_URL=url).returncode == 0
        relay = RelayProcess(
            tmp_path,
            OUTBOX_DATABASE_URL=server.url(CUT_OFF),
            OUTBOX_HANDLERS="tests.integration.recording:file_handlers",
            OUTBOX_INTERVAL="200ms",
            RECORDING_FILE=str(starts),
        )
        relays.append(relay)
        relay.wait_ready()
        first = _add(url)
        wait_until("the first delivery", lambda: first in recording.recorded(starts))

        with psycopg.connect(url) as blocker:
            # The relay's next claim waits in the server for this lock; the
            # partition falls, then the lock goes: the answer is lost on the way.
            blocker.execute("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")

            def claim_waits() -> bool:
                row = blocker.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                return row is not None and row[0] > 0

            wait_until("the relay's claim to wait in the server", claim_waits)
            with partition(server.port):
                blocker.rollback()
                during = _add(url)
                end = time.monotonic() + PARTITION
                wait_until("not ready", lambda: relay.status("/readyz") == 503, timeout=20)
                while time.monotonic() < end:  # the partition lasts; liveness holds
                    assert relay.status("/healthz") == 200, "liveness would restart the pod"
                    time.sleep(0.5)
            healed = time.monotonic()
        wait_until("the delivery after the heal", lambda: during in recording.recorded(starts))
        resumed = time.monotonic() - healed
        relay.wait_ready()
        assert relay.proc.poll() is None

    assert resumed < 8, f"delivering again only {resumed:.1f}s after the heal"
    print(f"partition of {PARTITION:.0f}s: delivering {resumed:.1f}s after the heal")
