"""What producers write cannot exhaust a relay: real processes, watched for memory.

A relay runs under the chart's memory limit; these tests watch its peak RSS
(VmHWM) while it works through what a careless producer left behind.
"""

from __future__ import annotations

import signal
from pathlib import Path

from tests.integration.process import RelayProcess, count, query, wait_until

CHART_LIMIT_MIB = 256


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def start(relays: list[RelayProcess], tmp_path: Path, db: str, **env: str) -> RelayProcess:
    relay = RelayProcess(tmp_path, OUTBOX_DATABASE_URL=db, OUTBOX_INTERVAL="100ms", **env)
    relays.append(relay)
    relay.wait_ready()
    return relay


def until_none_pending(db: str, timeout: float) -> None:
    wait_until(
        "every message buried",
        lambda: count(db, "SELECT count(*) FROM outbox_messages WHERE buried_at IS NULL") == 0,
        timeout=timeout,
    )


def test_a_typo_of_200k_messages_is_buried_in_batches_in_bounded_memory(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    query(
        db,
        "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
        " SELECT gen_random_uuid(), CASE WHEN n % 4 = 0 THEN 'orders.plcaed' ELSE"
        " 'billing.invoce' END, '{\"code\": \"493817\"}', now(), now()"
        " FROM generate_series(1, 200000) AS n",
    )
    relay = start(
        relays, tmp_path, db, OUTBOX_UNSERVED_GRACE="1s", OUTBOX_LOG_TOPICS="orders.placed"
    )

    until_none_pending(db, timeout=120)

    assert peak_rss_mib(relay.pid) < CHART_LIMIT_MIB / 2

    def lines() -> list[dict[str, str]]:
        return [r for r in relay.log_records() if "buried" in r["message"]]

    # The sweep logs once its last batch committed: a moment after the count is 0.
    wait_until("the sweep's log lines", lambda: len(lines()) >= 2, timeout=10)
    assert len(lines()) <= 4, lines()  # one a topic and sweep, never one a message
    assert {r["message"].split()[2] for r in lines()} == {
        "topic=billing.invoce",
        "topic=orders.plcaed",
    }
    assert "493817" not in relay.log
    relay.signal(signal.SIGTERM)
    assert relay.wait(15) == 0


def test_topics_producers_invent_never_become_label_values(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    query(
        db,
        "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
        " SELECT gen_random_uuid(), 'orders.customer-' || n || '.placed', '{}', now(), now()"
        " FROM generate_series(1, 20000) AS n",
    )
    relay = start(
        relays,
        tmp_path,
        db,
        OUTBOX_UNSERVED_GRACE="1s",
        OUTBOX_BACKLOG_INTERVAL="1s",
        OUTBOX_LOG_TOPICS="orders.placed",
    )
    until_none_pending(db, timeout=60)

    def scraped() -> str:
        return relay.get("/metrics")[1]

    wait_until(
        "the backlog counted", lambda: 'outbox_buried_messages{topic="_other"} 20000' in scraped()
    )
    text = scraped()
    topics = {
        line.split('topic="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if 'topic="' in line
    }
    assert topics == {"_other", "orders.placed"}
    assert 'outbox_buried_total{topic="_other"} 20000.0' in text
    assert len(text.splitlines()) < 400
    assert peak_rss_mib(relay.pid) < CHART_LIMIT_MIB / 2


def test_large_payloads_in_flight_stay_within_the_byte_budget(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    from tests.integration import recording

    # 60 payloads of 1 MiB (the default OUTBOX_MAX_PAYLOAD), every one due at once.
    query(
        db,
        "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
        f" SELECT gen_random_uuid(), '{recording.TOPIC}',"
        " json_build_object('blob', repeat('x', 1048000)), now(), now()"
        " FROM generate_series(1, 60)",
    )
    relay = start(
        relays,
        tmp_path,
        db,
        OUTBOX_HANDLERS="tests.integration.recording:handlers",
        RECORDING_DELAY="0.2",
    )
    until_none_pending(db, timeout=90)

    # 80 slots would hold 60 MiB of payloads; OUTBOX_IN_FLIGHT_BYTES (32 MiB) holds half.
    assert peak_rss_mib(relay.pid) < CHART_LIMIT_MIB / 2
