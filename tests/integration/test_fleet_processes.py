"""Several real `outbox relay` processes on one table: killed, stopped, skewed, mixed versions."""

from __future__ import annotations

import functools
import json
import re
import signal
import socket
import uuid
from pathlib import Path

import psycopg
import pytest

from outbox.postgres.ring import set_period
from tests.integration import recording
from tests.integration.process import (
    RelayProcess,
    add_messages,
    count,
    query,
    run_outbox,
    wait_until,
)
from tests.tools import require_library


def start(
    relays: list[RelayProcess],
    tmp_path: Path,
    db: str,
    recording_handler: bool = True,
    /,
    **settings: str,
) -> RelayProcess:
    env = {"OUTBOX_DATABASE_URL": db, "OUTBOX_INTERVAL": "100ms", **settings}
    if recording_handler:
        env["OUTBOX_HANDLERS"] = "tests.integration.recording:handlers"
    relay = RelayProcess(tmp_path, **env)
    relays.append(relay)
    return relay


def delivered(db: str) -> dict[object, int]:
    rows = query(db, "SELECT message_id, count(*) FROM deliveries GROUP BY 1")
    return {r[0]: int(r[1]) for r in rows}  # type: ignore[call-overload]


def outbox_empty(db: str) -> bool:
    return count(db, "SELECT count(*) FROM outbox_messages") == 0


def sample(metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_relays_killed_again_and_again_lose_nothing_and_repeat_only_their_slots(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    settings = {
        "OUTBOX_BATCH": "10",
        "OUTBOX_CONCURRENCY": "20",
        # Long enough that a relay starved of CPU while others start does not
        # time out (and legitimately repeat) a delivery it has made.
        "OUTBOX_TIMEOUT": "4s",
        "OUTBOX_LEASE": "5s",
        "RECORDING_DELAY": "0.005",
    }
    live = [start(relays, tmp_path, db, **settings) for _ in range(2)]
    for relay in live:
        relay.wait_ready()
    ids = add_messages(db, recording.TOPIC, 3000)
    killed: set[int] = set()

    for after in (300, 800, 1400, 2000):
        wait_until(f"{after} deliveries", functools.partial(_delivered, db, after), timeout=60)
        victim = live.pop(0)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        killed.add(victim.pid)
        live.append(start(relays, tmp_path, db, **settings))
    wait_until("the outbox to empty", lambda: outbox_empty(db), timeout=120)

    seen = delivered(db)
    assert set(seen) == set(ids), "a message was lost"
    repeated = {i for i, n in seen.items() if n > 1}
    first_by = {
        message_id: pid
        for message_id, pid in query(
            db,
            "SELECT DISTINCT ON (message_id) message_id, pid FROM deliveries"
            " ORDER BY message_id, seq",
        )
    }
    uncrashed = {i for i in repeated if first_by[i] not in killed}
    assert not uncrashed, f"repeated without a crash: {sorted(map(str, uncrashed))}"
    assert len(repeated) <= len(killed) * 20, "more repeats than the killed relays had slots"
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL") == 0


def test_a_relay_stopped_past_its_lease_changes_nothing_when_it_wakes(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    stalled = start(
        relays,
        tmp_path,
        db,
        OUTBOX_TIMEOUT="1s",
        OUTBOX_LEASE="3s",
        RECORDING_DELAY="5",  # every delivery outlives the timeout
    )
    stalled.wait_ready()
    ids = add_messages(db, recording.TOPIC, 5)
    wait_until("5 deliveries in flight", lambda: len(delivered(db)) == 5, timeout=10)
    stalled.signal(signal.SIGSTOP)  # within the timeout: nothing has failed yet

    healthy = start(relays, tmp_path, db, OUTBOX_TIMEOUT="1s", OUTBOX_LEASE="3s")
    wait_until("the healthy relay to take over", lambda: outbox_empty(db), timeout=30)
    stalled.signal(signal.SIGCONT)  # its deadlines have passed: it writes back retries

    def lost() -> float:
        return sample(stalled.get("/metrics")[1], 'outbox_lease_lost_total{topic="test.record"}')

    wait_until("the stale relay to count its lost leases", lambda: lost() == 5, timeout=15)
    assert outbox_empty(db), "a stale write-back brought a delivered message back"
    seen = delivered(db)
    assert set(seen) == set(ids)
    assert all(n == 2 for n in seen.values())  # once by each relay, no third owner
    records = stalled.log_records()
    lost_lines = [r["message"] for r in records if r["message"].startswith("lease lost")]
    assert len(lost_lines) == 5
    assert {m for i in ids for m in lost_lines if str(i) in m} == set(lost_lines)
    healthy.signal(signal.SIGTERM)
    assert healthy.wait(15) == 0


@pytest.mark.parametrize(("offset", "side"), [("+5m", "ahead of"), ("-5m", "behind")])
def test_a_relay_whose_clock_is_minutes_off_delivers_nothing_twice(
    db: str, relays: list[RelayProcess], tmp_path: Path, offset: str, side: str
) -> None:
    library = require_library("/usr/lib/*/faketime/libfaketime.so.1", "faketime")
    settings = {"OUTBOX_BATCH": "10", "OUTBOX_CONCURRENCY": "20", "RECORDING_DELAY": "0.05"}
    honest = start(relays, tmp_path, db, **settings)
    # The library is preloaded into the relay itself (not the faketime wrapper,
    # which would fork it), so the pid held here is the skewed relay.
    skewed = start(
        relays,
        tmp_path,
        db,
        LD_PRELOAD=library,
        FAKETIME=offset,
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        **settings,
    )
    honest.wait_ready()
    skewed.wait_ready()
    ids = add_messages(db, recording.TOPIC, 600)

    wait_until("the outbox to empty", lambda: outbox_empty(db), timeout=60)

    seen = delivered(db)
    assert set(seen) == set(ids)
    assert max(seen.values()) == 1, "a skewed relay took messages under another's lease"
    pids = {r[0] for r in query(db, "SELECT DISTINCT pid FROM deliveries")}
    assert pids == {honest.pid, skewed.pid}
    skew = sample(skewed.get("/metrics")[1], "outbox_clock_skew_seconds")
    assert 290 < (skew if side == "ahead of" else -skew) < 310
    assert abs(sample(honest.get("/metrics")[1], "outbox_clock_skew_seconds")) < 1
    said = [r["message"] for r in skewed.log_records()]
    assert sum("clock is" in m and f"{side} the database's" in m for m in said) == 1


def test_a_rolling_deploy_buries_nothing(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    ids = add_messages(db, recording.TOPIC, 50)
    old = start(relays, tmp_path, db, False, OUTBOX_LOG_TOPICS="orders.placed")
    old.wait_ready()
    # Its first sweep notes the topic nobody serves; it polls every 100ms meanwhile.
    wait_until("the unserved topic to be noted", lambda: _noted(db), timeout=10)
    wait_until("a second of polls", lambda: _polled_for(db, seconds=1), timeout=10)

    assert count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL") == 0
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE attempts > 0") == 0

    new = start(relays, tmp_path, db, POD_NAME="outbox-relay-7d9f6-x2k4q")  # the chart's
    new.wait_ready()
    wait_until("the new relay to deliver", lambda: outbox_empty(db), timeout=30)
    listed = run_outbox("relays", "--output", "json", OUTBOX_DATABASE_URL=db)
    assert listed.returncode == 0, listed.stderr
    served = {r["pid"]: r["topics"] for r in json.loads(listed.stdout)}
    assert served == {old.pid: ["orders.placed"], new.pid: [recording.TOPIC]}
    hosts = {r["pid"]: r["host"] for r in json.loads(listed.stdout)}
    assert hosts == {old.pid: socket.gethostname(), new.pid: "outbox-relay-7d9f6-x2k4q"}
    table = run_outbox("relays", OUTBOX_DATABASE_URL=db)
    assert "served by some relays only" in table.stdout
    assert recording.TOPIC in table.stdout.splitlines()[-1]

    seen = delivered(db)
    assert set(seen) == set(ids)
    assert max(seen.values()) == 1
    for relay in (old, new):
        relay.signal(signal.SIGTERM)
        assert relay.wait(15) == 0
    assert count(db, "SELECT count(*) FROM outbox_relays") == 0, "a clean exit leaves no row"


def test_two_relays_deliver_everything_once_while_a_report_holds_a_snapshot(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    with psycopg.connect(db, autocommit=True) as owner:
        set_period(owner, 1)  # a test-sized ring: slots of a second
    # Any snapshot counts as held: their claims read on from a watermark.
    held = {
        "OUTBOX_BACKLOG_INTERVAL": "200ms",
        "OUTBOX_SNAPSHOT_HELD_AFTER": "0s",
        "OUTBOX_INTERVAL": "100ms",  # housekeeping, and so the rotation
    }
    live = [start(relays, tmp_path, db, **held) for _ in range(2)]
    for relay in live:
        relay.wait_ready()
    with psycopg.connect(db) as report:  # a report in REPEATABLE READ, open throughout
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM outbox_topics").fetchone()
        files = _ring_files(db)
        ids: list[uuid.UUID] = []

        def emptied() -> bool:
            """Both ring slots were truncated under the held snapshot (new files:
            their dead rows returned at once); producers write meanwhile."""
            ids.extend(add_messages(db, recording.TOPIC, 100))
            now = _ring_files(db)
            return all(now[slot] != files[slot] for slot in files)

        wait_until("the ring's slots to be emptied", emptied, timeout=30)
        wait_until("the outbox to empty", lambda: outbox_empty(db), timeout=60)
        # The relays see the snapshot, and say so without naming its session.
        wait_until(
            "the relays to export the held snapshot",
            lambda: all(
                sample(r.get("/metrics")[1], "outbox_oldest_snapshot_transactions") >= 5
                for r in live
            ),
            timeout=10,
        )
        report.rollback()

    seen = delivered(db)
    assert set(seen) == set(ids), "a message was lost"
    assert max(seen.values()) == 1, "a message was delivered twice without a crash"
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL") == 0
    metrics = live[0].get("/metrics")[1]
    assert re.search(r"^outbox_oldest_snapshot_age_seconds \S+$", metrics, re.MULTILINE)


def _ring_files(db: str) -> dict[str, int]:
    """The file of each ring partition (TRUNCATE gives a partition a new one)."""
    rows = query(
        db,
        "SELECT relname, relfilenode FROM pg_class"
        " WHERE relname IN ('outbox_messages_0', 'outbox_messages_1')"
        " AND relnamespace = to_regnamespace(current_schema())",
    )
    assert len(rows) == 2, rows
    return {str(name): int(str(node)) for name, node in rows}


def _noted(db: str) -> bool:
    return count(db, "SELECT count(*) FROM outbox_unserved") == 1


def _polled_for(db: str, seconds: int) -> bool:
    return (
        count(
            db,
            "SELECT count(*) FROM outbox_unserved"
            f" WHERE since < now() - interval '{seconds} seconds'",
        )
        == 1
    )


def test_after_a_kill_the_orphans_go_before_what_was_added_after_them(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    lease = {"OUTBOX_LEASE": "2s", "OUTBOX_TIMEOUT": "1s", "OUTBOX_CONCURRENCY": "4"}
    doomed = start(relays, tmp_path, db, RECORDING_DELAY="30", **lease)
    doomed.wait_ready()
    early = add_messages(db, recording.TOPIC, 4)
    wait_until("4 deliveries in flight", lambda: len(delivered(db)) == 4, timeout=10)
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    later = add_messages(db, recording.TOPIC, 1000)

    survivor = start(relays, tmp_path, db, RECORDING_DELAY="0.02", **lease)
    wait_until("the outbox to empty", lambda: outbox_empty(db), timeout=120)

    order = [
        r[0]
        for r in query(
            db, f"SELECT message_id FROM deliveries WHERE pid = {survivor.pid} ORDER BY seq"
        )
    ]
    position = {message_id: i for i, message_id in enumerate(order)}
    assert set(early) <= set(position), "an orphan was lost"
    # Claimed again once their lease ended, ahead of the backlog added after them
    # (before, they waited until all 1,000 had gone).
    assert max(position[i] for i in early) < len(later) // 2


def _delivered(db: str, n: int) -> bool:
    """At least ``n`` deliveries are recorded."""
    return len(delivered(db)) >= n
