"""Ordering per key across a fleet of real `outbox relay` processes that are
killed with -9 while a keyed backlog drains and handlers fail now and then."""

from __future__ import annotations

import collections
import itertools
import json
import signal
from pathlib import Path

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import RelayProcess, count, query, run_outbox, wait_until

KEYS, PER_KEY = 60, 25


def starts(path: Path) -> list[tuple[str, int]]:
    """(key, n) of every handler start, in the order they happened."""
    if not path.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in path.read_text().splitlines()]


def in_order(seen: list[tuple[str, int]], key: str) -> list[int]:
    """The messages of ``key`` started, in order, a repeat (a retry) counted once;
    AssertionError when one started before an earlier one of the key."""
    ns = [n for k, n in seen if k == key]
    assert ns == sorted(ns), f"{key}: out of order: {ns}"
    return sorted(set(ns))


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
        # Sweeps (which also repair a key whose head's relay died between its
        # ack and unparking the next) every 5 s.
        "OUTBOX_UNSERVED_GRACE": "20s",
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
        timeout=120,
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


@pytest.mark.parametrize("on_buried", ["block", "skip"])
def test_a_poison_head_holds_its_key_or_is_skipped_as_the_topic_says(
    db: str, relays: list[RelayProcess], tmp_path: Path, on_buried: str
) -> None:
    record = tmp_path / "starts"
    env = {"OUTBOX_DATABASE_URL": db}
    relay = RelayProcess(
        tmp_path,
        OUTBOX_HANDLERS="tests.integration.recording:keyed_handlers",
        OUTBOX_INTERVAL="100ms",
        OUTBOX_UNSERVED_GRACE="20s",  # sweeps, and their key repair, every 5 s
        RECORDING_FILE=str(record),
        **env,
    )
    relays.append(relay)
    relay.wait_ready()
    # An entry for a topic the relays' own handlers serve: only its ordering.
    tuned = run_outbox("topics", "set", recording.KEYED, "--on-buried", on_buried, **env)
    assert tuned.returncode == 0, tuned.stderr
    with psycopg.connect(db) as conn, conn.transaction():
        add_sync(
            conn,
            new_message(recording.KEYED, {"n": 0, "poison": True}, key="p"),
            *(new_message(recording.KEYED, {"n": n}, key=k) for n in (1, 2) for k in "pq"),
        )
    buried = "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL"
    wait_until("the poison's burial", lambda: count(db, buried) == 1)
    wait_until("key q", lambda: {("q", 1), ("q", 2)} <= set(starts(record)))
    with psycopg.connect(db) as conn, conn.transaction():  # a later message, to see polls pass
        add_sync(conn, new_message(recording.KEYED, {"n": 3}, key="q"))
    wait_until("key q's last", lambda: ("q", 3) in starts(record))

    p = [n for k, n in starts(record) if k == "p"]
    if on_buried == "skip":
        wait_until("key p past its poison", lambda: in_order(starts(record), "p") == [0, 1, 2])
        return
    assert p == [0], "block: nothing of the key after its buried head"
    shown = run_outbox("keys", "blocked", "--output", "json", **env)
    assert shown.returncode == 0, shown.stderr
    [blocked] = json.loads(shown.stdout)
    assert (blocked["key"], blocked["buried"], blocked["waiting"]) == ("p", True, 2)
    assert "Permanent" in blocked["reason"] or "no retry" in blocked["reason"]
    purged = run_outbox("buried", "purge", "--older-than", "0s", "--yes", **env)
    assert purged.returncode == 0, purged.stderr
    try:
        wait_until(
            "key p after the purge",
            lambda: in_order(starts(record), "p") == [0, 1, 2],
        )
    except AssertionError:
        rows = query(
            db, "SELECT key, seq, leased_until::text, buried_at, attempts FROM outbox_messages"
        )
        raise AssertionError(f"{rows}\n{relay.log[-3000:]}") from None
