"""Ordering per key across a fleet of real `outbox relay` processes that are
killed with -9 while a keyed backlog drains and handlers fail now and then."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import re
import signal
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from outbox import new_message
from outbox.postgres import add_sync
from tests.integration import recording
from tests.integration.process import REPO, RelayProcess, count, query, run_outbox, wait_until
from tests.integration.releases import export_release
from tests.tools import require_library

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
    total = _add_keyed(db, KEYS, PER_KEY)
    for after in (200, 600, 1000):
        wait_until(f"{after} starts", functools.partial(_started, record, after), timeout=90)
        victim = live.pop(0)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        live.append(start())
    _drained(db, timeout=120)

    seen = starts(record)
    _assert_in_order_and_complete(seen, total)
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


def _drained(
    db: str,
    what: str = "the outbox to empty",
    timeout: float = 90,
    relays: Sequence[RelayProcess] = (),
) -> None:
    try:
        wait_until(what, lambda: count(db, "SELECT count(*) FROM outbox_messages") == 0, timeout)
    except AssertionError as timed_out:
        rows = query(
            db,
            "SELECT slot, key, seq, leased_until::text, due_at::text, attempts, buried_at::text"
            " FROM outbox_messages ORDER BY key, seq LIMIT 20",
        )
        logs = "\n".join(r.log[-2000:] for r in relays)
        raise AssertionError(f"{timed_out}: left {rows}\n{logs}") from None


def _records(path: Path) -> list[tuple[str, int, int, int, str]]:
    """(key, n, pid, attempt, id) of every handler start, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        key, n, pid, attempt, mid = line.split()
        out.append((key, int(n), int(pid), int(attempt), mid))
    return out


def _add_keyed(db: str, keys: int, per_key: int) -> int:
    """Interleaved keys, each transaction a slice of every key in order."""
    with psycopg.connect(db) as conn:
        for n0 in range(0, per_key, 5):
            with conn.transaction():
                add_sync(
                    conn,
                    *(
                        new_message(recording.KEYED, {"n": n}, key=f"order-{k}")
                        for n in range(n0, min(n0 + 5, per_key))
                        for k in range(keys)
                    ),
                )
    return keys * per_key


def _assert_in_order_and_complete(seen: list[tuple[str, int]], total: int) -> None:
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, n in seen:
        by_key[key].append(n)
    assert len(set(seen)) == total, "a message was never delivered"
    for key, ns in by_key.items():
        early = [(a, b) for a, b in itertools.pairwise(ns) if b < a]
        assert not early, f"{key}: a start before an earlier message's: {early[:3]} in {ns}"


def _keyed_relay(relays: list[RelayProcess], tmp_path: Path, db: str, **env: str) -> RelayProcess:
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_HANDLERS="tests.integration.recording:keyed_handlers",
        OUTBOX_INTERVAL="100ms",
        RECORDING_FILE=str(tmp_path / "starts"),
        **env,
    )
    relays.append(relay)
    return relay


def test_a_relay_stopped_past_its_lease_mid_key_changes_nothing_when_it_wakes(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    record = tmp_path / "starts"
    # Every delivery outlives the stalled relay's timeout: it is stopped while
    # its keys' heads are in its handlers and their runs wait in its hands.
    stalled = _keyed_relay(
        relays, tmp_path, db, OUTBOX_TIMEOUT="1s", OUTBOX_LEASE="3s", RECORDING_DELAY="5"
    )
    stalled.wait_ready()
    total = _add_keyed(db, keys=5, per_key=10)
    wait_until("the 5 heads in the stalled relay's handlers", lambda: len(_records(record)) == 5)
    stalled.signal(signal.SIGSTOP)

    healthy = _keyed_relay(relays, tmp_path, db, OUTBOX_TIMEOUT="1s", OUTBOX_LEASE="3s")
    _drained(db, "the healthy relay to drain the keys")
    stalled.signal(signal.SIGCONT)  # its deadlines have passed: it writes back what it held

    def lost() -> float:
        metrics = stalled.get("/metrics")[1]
        found = re.search(r'^outbox_lease_lost_total\{topic="test.keyed"\} (\S+)$', metrics, re.M)
        return float(found[1]) if found else 0.0

    wait_until("the stale relay to count its lost leases", lambda: lost() >= 5, timeout=15)
    records = _records(record)
    assert [r for r in records if r[2] == stalled.pid] == records[:5], (
        "the stale relay started nothing after it woke"
    )
    _assert_in_order_and_complete([(k, n) for k, n, *_ in records], total)
    assert count(db, "SELECT count(*) FROM outbox_messages") == 0, "a stale write brought one back"
    healthy.signal(signal.SIGTERM)
    assert healthy.wait(15) == 0


@pytest.mark.parametrize("offset", ["+5m", "-5m"])
def test_keys_stay_in_order_beside_a_relay_whose_clock_is_minutes_off(
    db: str, relays: list[RelayProcess], tmp_path: Path, offset: str
) -> None:
    library = require_library("/usr/lib/*/faketime/libfaketime.so.1", "faketime")
    record = tmp_path / "starts"
    honest = _keyed_relay(relays, tmp_path, db, OUTBOX_BATCH="10", RECORDING_DELAY="0.002")
    skewed = _keyed_relay(
        relays,
        tmp_path,
        db,
        OUTBOX_BATCH="10",
        RECORDING_DELAY="0.002",
        LD_PRELOAD=library,
        FAKETIME=offset,
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    honest.wait_ready()
    skewed.wait_ready()
    total = _add_keyed(db, keys=30, per_key=20)

    _drained(db, relays=[honest, skewed])

    records = _records(record)
    _assert_in_order_and_complete([(k, n) for k, n, *_ in records], total)
    attempts: dict[str, list[int]] = collections.defaultdict(list)
    for *_, attempt, mid in records:
        attempts[mid].append(attempt)
    for mid, seen in attempts.items():
        failed_once = uuid.UUID(mid).int % 30 == 0  # keyed_start's designed failure
        assert seen == ([1, 2] if failed_once else [1]), f"{mid} was claimed under a lease: {seen}"
    assert {r[2] for r in records} == {honest.pid, skewed.pid}, "both relays took keys"


def test_a_relay_that_lacks_the_keyed_handler_leaves_its_keys_to_the_one_that_has_it(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    record = tmp_path / "starts"
    total = _add_keyed(db, keys=10, per_key=10)
    # The release before: it serves another topic only and never claims these.
    old = RelayProcess(
        tmp_path, OUTBOX_DATABASE_URL=db, OUTBOX_INTERVAL="100ms", OUTBOX_LOG_TOPICS="orders.placed"
    )
    relays.append(old)
    old.wait_ready()
    new = _keyed_relay(relays, tmp_path, db)
    new.wait_ready()

    _drained(db, "the new relay to deliver every key")

    records = _records(record)
    _assert_in_order_and_complete([(k, n) for k, n, *_ in records], total)
    assert {r[2] for r in records} == {new.pid}
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL") == 0
    for relay in (old, new):
        relay.signal(signal.SIGTERM)
        assert relay.wait(15) == 0


def _started(record: Path, n: int) -> bool:
    """At least ``n`` handler starts are recorded."""
    return len(starts(record)) >= n


PREVIOUS = "5772755"
"""The last commit before message headers: its claim returns other columns and
knows no `headers` column, the shape of a relay a rolling upgrade leaves behind."""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PREVIOUS's src/: the release without headers."""
    return export_release(PREVIOUS, tmp_path_factory.mktemp("previous"), "outbox.headers")


def test_keys_stay_in_order_across_a_fleet_of_two_versions_killed_mid_backlog(
    db: str, relays: list[RelayProcess], tmp_path: Path, previous_release: Path
) -> None:
    record = tmp_path / "starts"
    settings = {"OUTBOX_TIMEOUT": "4s", "OUTBOX_LEASE": "5s", "RECORDING_DELAY": "0.002"}
    # The previous release imports its own package first, the tests' handler after.
    older = {"PYTHONPATH": os.pathsep.join([str(previous_release), str(REPO)])}

    previous: set[int] = set()  # the pids of relays of the previous release

    def start(version: dict[str, str]) -> RelayProcess:
        relay = _keyed_relay(relays, tmp_path, db, **settings, **version)
        relay.wait_ready()
        if version:
            previous.add(relay.pid)
        return relay

    live = [start(older), start({}), start(older)]
    with psycopg.connect(db) as conn, conn.transaction():  # headers the old relay never reads
        add_sync(conn, new_message(recording.KEYED, {"n": 0}, key="h", headers={"x-a": "b"}))
    total = 1 + _add_keyed(db, KEYS, 20)
    for after, version in ((300, {}), (700, older)):
        wait_until(f"{after} starts", functools.partial(_started, record, after), timeout=90)
        victim = live.pop(0)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        live.append(start(version))
    _drained(db, timeout=120)

    seen = starts(record)
    _assert_in_order_and_complete(seen, total)
    pids = {pid for _, _, pid, _, _ in _records(record)}
    # Which relay claims first is the scheduler's choice: one of either version.
    assert pids & previous, "the previous release delivered"
    assert pids - previous, "the current release delivered"
