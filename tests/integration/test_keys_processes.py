"""Ordering per key across a fleet of real `outbox relay` processes that are
killed with -9 while a keyed backlog drains and handlers fail now and then."""

from __future__ import annotations

import collections
import itertools
import signal
from pathlib import Path

import psycopg

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import RelayProcess, count, wait_until

KEYS, PER_KEY = 60, 25


def starts(path: Path) -> list[tuple[str, int]]:
    """(key, n) of every handler start, in the order they happened."""
    if not path.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in path.read_text().splitlines()]


def test_three_relays_killed_mid_backlog_start_no_message_before_an_earlier_one_of_its_key(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    record = tmp_path / "starts"
    settings = {
        "OUTBOX_DATABASE_URL": db,
        "OUTBOX_HANDLERS": "tests.integration.recording:keyed_handlers",
        "OUTBOX_INTERVAL": "100ms",
        "OUTBOX_TIMEOUT": "4s",
        "OUTBOX_LEASE": "5s",
        "RECORDING_FILE": str(record),
        "RECORDING_DELAY": "0.002",
    }

    def start() -> RelayProcess:
        relay = RelayProcess(tmp_path, **settings)
        relays.append(relay)
        return relay

    live = [start() for _ in range(3)]
    for relay in live:
        relay.wait_ready()
    # Interleaved keys, each transaction holding a slice of every key in order.
    with psycopg.connect(db) as conn:
        for n0 in range(0, PER_KEY, 5):
            with conn.transaction():
                add_sync(
                    conn,
                    *(
                        new_message(recording.KEYED, {"n": n}, key=f"order-{k}")
                        for n in range(n0, n0 + 5)
                        for k in range(KEYS)
                    ),
                )
    total = KEYS * PER_KEY
    for after in (200, 600, 1000):
        wait_until(f"{after} starts", lambda n=after: len(starts(record)) >= n, timeout=90)
        victim = live.pop(0)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        live.append(start())
    wait_until(
        "the outbox to empty",
        lambda: count(db, "SELECT count(*) FROM outbox_messages") == 0,
        timeout=180,
    )

    seen = starts(record)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, n in seen:
        by_key[key].append(n)
    assert len({(k, n) for k, n in seen}) == total, "a message was never delivered"
    for key, ns in by_key.items():
        early = [(a, b) for a, b in itertools.pairwise(ns) if b < a]
        assert not early, f"{key}: a start before an earlier message's: {early[:3]} in {ns}"
    assert len(seen) > total, "no failure or kill made a redelivery: the test proved little"
