"""A primary and its synchronous standby swap roles while a relay delivers and a
producer writes: nothing committed is lost, and the relay follows the new
primary through libpq's multi-host URL (``target_session_attrs=read-write``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import RelayProcess, run_outbox, wait_until
from tests.integration.servers import primary, standby


class Producer(threading.Thread):
    """Adds one message after another through ``url``, reconnecting on failure.

    ``committed`` holds the ids whose commit returned; ``unsure`` those whose
    commit failed midway (committed or not: the client cannot tell)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.committed: list[str] = []
        self.unsure: set[str] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with psycopg.connect(self.url, prepare_threshold=None) as conn:
                    while not self.halt.is_set():
                        m = new_message(recording.TOPIC, {"n": len(self.committed)})
                        try:
                            with conn.transaction():
                                add_sync(conn, m)
                        except psycopg.OperationalError:
                            self.unsure.add(str(m.id))
                            raise
                        self.committed.append(str(m.id))
                        self.halt.wait(0.01)
            except psycopg.OperationalError:
                self.halt.wait(0.1)  # the new primary is coming up


@pytest.mark.parametrize("crash", [False, True], ids=["switchover", "crash"])
def test_a_relay_follows_a_failover_and_nothing_committed_is_lost(
    tmp_path: Path, relays: list[RelayProcess], crash: bool
) -> None:
    starts = tmp_path / "starts"
    with primary() as old:
        new = standby(old)
        url = (
            f"postgresql://postgres@127.0.0.1:{old.port},127.0.0.1:{new.port}/test"
            "?target_session_attrs=read-write&connect_timeout=2"
        )
        done = run_outbox("migrate", OUTBOX_DATABASE_URL=url)
        assert done.returncode == 0, done.stderr
        relay = RelayProcess(
            tmp_path,
            OUTBOX_DATABASE_URL=url,
            OUTBOX_HANDLERS="tests.integration.recording:file_handlers",
            OUTBOX_INTERVAL="200ms",
            RECORDING_FILE=str(starts),
        )
        relays.append(relay)
        relay.wait_ready()
        producer = Producer(url)
        producer.start()
        try:
            wait_until(
                "deliveries before the failover", lambda: len(recording.recorded(starts)) > 50
            )
            old.stop("immediate" if crash else "fast")
            new.promote()
            promoted = time.monotonic()
            before = len(producer.committed)
            wait_until("a commit on the new primary", lambda: len(producer.committed) > before)
            first = producer.committed[before]
            wait_until("its delivery", lambda: first in recording.recorded(starts), timeout=30)
            resumed = time.monotonic() - promoted
            wait_until("more commits", lambda: len(producer.committed) > before + 100)
        finally:
            producer.halt.set()
            producer.join(10)
        committed = set(producer.committed)
        wait_until(
            "every committed message delivered",
            lambda: committed <= set(recording.recorded(starts)),
            timeout=60,
        )
        with psycopg.connect(new.url(), autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)

            def settled() -> bool:
                return conn.execute("SELECT count(*) FROM outbox_messages").fetchone() == (0,)

            wait_until("every delivery acked", settled)
        relay.wait_ready()  # never restarted: the same process, ready again

    delivered = recording.recorded(starts)
    assert committed <= set(delivered), "a committed message was never delivered"
    assert set(delivered) <= committed | producer.unsure, "a message nobody committed"
    assert "read-only transaction" not in relay.log  # never settled on the standby
    assert resumed < 15, f"delivering again {resumed:.1f}s after the promotion"
    print(f"{'crash' if crash else 'switchover'}: delivering {resumed:.1f}s after promotion, "
          f"{len(delivered) - len(set(delivered))} redelivered")  # fmt: skip
