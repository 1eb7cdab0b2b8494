"""An online upgrade to the ring of partitions (migrations 16-18) while a fleet of
the release before it drains a keyed backlog and producers keep adding: nothing
is lost, no key goes out of order, both releases deliver."""

from __future__ import annotations

import functools
import os
import signal
import threading
from pathlib import Path

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import REPO, RelayProcess, count, query, run_outbox, wait_until
from tests.integration.releases import export_release
from tests.integration.test_keys_processes import (
    _add_keyed,
    _assert_in_order_and_complete,
    _drained,
    _keyed_relay,
    _records,
    _started,
    starts,
)
from tools.upgrade import earlier_release

pytestmark = pytest.mark.postgres_only

BEFORE_RING = "f05f1e5"
"""The last commit before the ring: its relays know outbox_messages as one table."""
SCHEMA_BEFORE_RING = 15


@pytest.fixture(scope="module")
def before_ring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BEFORE_RING's src/: the release without the ring."""
    return export_release(
        BEFORE_RING, tmp_path_factory.mktemp("before-ring"), "outbox.postgres.ring"
    )


def test_a_fleet_of_the_release_before_keeps_delivering_through_the_upgrade_to_the_ring(
    pg_conninfo: str, relays: list[RelayProcess], tmp_path: Path, before_ring: Path
) -> None:
    db = pg_conninfo
    earlier_release(db, 0, upto=SCHEMA_BEFORE_RING)
    query(db, recording.DDL)
    settings = {"OUTBOX_TIMEOUT": "4s", "OUTBOX_LEASE": "5s", "RECORDING_DELAY": "0.002"}
    older = {"PYTHONPATH": os.pathsep.join([str(before_ring), str(REPO)])}
    old = [_keyed_relay(relays, tmp_path, db, **settings, **older) for _ in range(2)]
    for relay in old:
        relay.wait_ready()
    total = _add_keyed(db, 60, 20)  # a backlog in the table as it was
    record = tmp_path / "starts"
    wait_until("200 starts", functools.partial(_started, record, 200), timeout=60)

    added = [0]
    stop = threading.Event()

    def produce() -> None:  # a producer of the release before: it knows one table
        with psycopg.connect(db, autocommit=True) as conn:
            n = 0
            while not stop.is_set() or n < 5:
                with conn.transaction():
                    add_sync(
                        conn,
                        *(
                            new_message(recording.KEYED, {"n": n}, key=f"late-{k}")
                            for k in range(4)
                        ),
                    )
                added[0] += 4
                n += 1
                stop.wait(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        migrated = run_outbox("migrate", OUTBOX_DATABASE_URL=db)
        assert migrated.returncode == 0, migrated.stderr
        partitions = (
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_messages'::regclass"
        )
        assert count(db, partitions) == 3  # the ring's two slots and the table as it was
        current = _keyed_relay(relays, tmp_path, db, **settings)
        current.wait_ready()
        old[0].signal(signal.SIGKILL)  # a relay of the release before dies mid-upgrade
        old[0].wait(10)
        wait_until(
            "the current release to deliver",
            lambda: current.pid in {r[2] for r in _records(record)},
            timeout=60,
        )
    finally:
        stop.set()
        producer.join(30)
    _drained(db, timeout=120)

    _assert_in_order_and_complete(starts(record), total + added[0])
    pids = {r[2] for r in _records(record)}
    assert {old[0].pid, old[1].pid} & pids, "the release before delivered"
    assert current.pid in pids
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL") == 0
