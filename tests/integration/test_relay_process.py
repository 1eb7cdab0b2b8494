"""`outbox relay` and `outbox migrate` as real processes against a real PostgreSQL."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.postgres import migrate
from outbox.service.embedded import EmbeddedPostgres
from tests.integration import recording
from tests.integration.process import (
    RelayProcess,
    add_messages,
    count,
    query,
    run_outbox,
    wait_until,
)


def recording_relay(
    relays: list[RelayProcess], tmp_path: Path, db: str, **settings: str
) -> RelayProcess:
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_HANDLERS="tests.integration.recording:handlers",
        OUTBOX_INTERVAL="100ms",
        **settings,
    )
    relays.append(relay)
    return relay


def outbox_empty(db: str) -> bool:
    return count(db, "SELECT count(*) FROM outbox_messages") == 0


def delivered_count(db: str) -> int:
    return count(db, "SELECT count(*) FROM deliveries")


def deliveries(db: str) -> Counter[object]:
    return Counter(r[0] for r in query(db, "SELECT message_id FROM deliveries"))


def test_migrate_command_applies_schema_once(pg_conninfo: str) -> None:
    first = run_outbox("migrate", OUTBOX_DATABASE_URL=pg_conninfo, OUTBOX_LOG_FORMAT="text")
    second = run_outbox("migrate", OUTBOX_DATABASE_URL=pg_conninfo, OUTBOX_LOG_FORMAT="text")

    assert first.returncode == 0, first.stderr
    assert "applied migration 0001_outbox_messages" in first.stderr
    assert second.returncode == 0, second.stderr
    assert "applied nothing" in second.stderr
    assert count(pg_conninfo, "SELECT count(*) FROM outbox_schema_migrations") >= 1


def test_relay_delivers_counts_and_answers_probes(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    # trust authentication ignores it, but it must never be shown
    secret = "pa55-w0rd-never-shown"
    url = db if conninfo_to_dict(db).get("password") else make_conninfo(db, password=secret)
    relay = recording_relay(relays, tmp_path, url, OUTBOX_LOG_TOPICS="test.log")
    relay.wait_ready()
    ids = add_messages(db, recording.TOPIC, 30)
    add_messages(db, "test.log", 5)

    wait_until("the outbox to empty", lambda: outbox_empty(db))

    assert set(deliveries(db)) == set(ids)
    status, metrics = relay.get("/metrics")
    assert status == 200
    assert 'outbox_delivered_total{topic="test.record"} 30.0' in metrics
    assert 'outbox_delivered_total{topic="test.log"} 5.0' in metrics
    assert relay.get("/healthz") == (200, "ok\n")
    assert relay.get("/readyz") == (200, "ok\n")
    assert relay.status("/nope") == 404
    relay.signal(signal.SIGTERM)
    assert relay.wait(15) == 0
    logged = relay.log
    assert logged.count('"delivered message=') == 5
    for leak in (secret, "493817"):
        assert leak not in logged
        assert leak not in metrics


def test_relay_refuses_an_unmigrated_database(pg_conninfo: str) -> None:
    result = run_outbox(
        "relay", OUTBOX_DATABASE_URL=pg_conninfo, OUTBOX_LOG_TOPICS="a", OUTBOX_HTTP_PORT="0"
    )

    assert result.returncode == 1
    assert "run `outbox migrate` first" in result.stderr.splitlines()[-1]


def test_sigterm_finishes_in_flight_and_leaves_nothing_leased(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = recording_relay(
        relays, tmp_path, db, OUTBOX_BATCH="10", OUTBOX_TIMEOUT="5s", RECORDING_DELAY="0.3"
    )
    relay.wait_ready()
    ids = add_messages(db, recording.TOPIC, 60)
    wait_until("a delivery", lambda: delivered_count(db) >= 1)

    started = time.monotonic()
    relay.signal(signal.SIGTERM)
    assert relay.wait(15) == 0
    assert time.monotonic() - started < 5 + 3

    left = {r[0] for r in query(db, "SELECT id FROM outbox_messages")}
    delivered = set(deliveries(db))
    assert left | delivered == set(ids)
    assert not left & delivered, "a delivered message was not acked"
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE leased_until IS NOT NULL") == 0
    assert count(db, "SELECT count(*) FROM outbox_messages WHERE attempts > 0") == 0


def test_second_signal_exits_at_once_and_hands_the_batch_back(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = recording_relay(
        relays, tmp_path, db, OUTBOX_TIMEOUT="30s", OUTBOX_LEASE="5m", RECORDING_DELAY="60"
    )
    relay.wait_ready()
    add_messages(db, recording.TOPIC, 3)
    wait_until("3 deliveries in flight", lambda: delivered_count(db) == 3)

    started = time.monotonic()
    relay.signal(signal.SIGTERM)
    wait_until("the first signal to register", lambda: "stopping" in relay.log, timeout=5)
    relay.signal(signal.SIGINT)
    assert relay.wait(10) == 128 + signal.SIGINT
    assert time.monotonic() - started < 5

    assert count(db, "SELECT count(*) FROM outbox_messages WHERE leased_until IS NULL") == 3


def test_unreachable_database_at_start_is_one_line_without_the_password() -> None:
    url = "postgresql://outbox:hunter2-secret@127.0.0.1:1/outbox?connect_timeout=2"

    result = run_outbox("relay", OUTBOX_DATABASE_URL=url, OUTBOX_LOG_TOPICS="a")

    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("outbox relay: OUTBOX_DATABASE_URL: cannot connect")
    assert "hunter2" not in result.stderr


def test_help_lists_every_setting_of_the_relay() -> None:
    result = run_outbox("relay", "--help")

    assert result.returncode == 0
    for variable in ("OUTBOX_DATABASE_URL", "OUTBOX_LEASE", "OUTBOX_HTTP_PORT", "OUTBOX_BATCH"):
        assert variable in result.stdout


@contextmanager
def private_postgres(
    data: Path, relays: list[RelayProcess]
) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL of the test's own, to stop and start, migrated for the recording relay.

    The relays are stopped before the server, so none outlives it.
    """
    data.mkdir()
    data.chmod(0o755)  # as root, the server runs as its own user
    server = EmbeddedPostgres(data / "pgdata")
    url = server.start()
    try:
        anyio.run(migrate, url)
        query(url, recording.DDL)
        yield server, url
    finally:
        for relay in relays:
            relay.stop()
        server.stop()


def test_delivery_resumes_after_the_database_restarts(
    relays: list[RelayProcess], tmp_path: Path
) -> None:
    with private_postgres(tmp_path / "restart", relays) as (server, url):
        relay = recording_relay(
            relays,
            tmp_path,
            url,
            OUTBOX_BATCH="5",
            OUTBOX_TIMEOUT="2s",
            OUTBOX_LEASE="5s",
            RECORDING_DELAY="0.02",
        )
        relay.wait_ready()
        ids = add_messages(url, recording.TOPIC, 300)
        wait_until("50 deliveries", lambda: delivered_count(url) >= 50)

        server.stop()
        wait_until("readiness to fail", lambda: relay.status("/readyz") == 503, timeout=10)
        assert relay.status("/healthz") == 200
        assert server.start() == url
        wait_until("the outbox to empty", lambda: outbox_empty(url), timeout=90)

        seen = deliveries(url)
        assert set(seen) == set(ids), "a message was lost"
        repeated = [i for i, n in seen.items() if n > 1]
        assert len(repeated) <= 5, "repeats beyond the batch in flight at the restart"
        assert relay.proc.poll() is None
        assert relay.status("/readyz") == 200
        assert any("database unavailable" in r["message"] for r in relay.log_records())


def test_without_database_url_relay_runs_on_embedded_postgres_and_stops_it(
    relays: list[RelayProcess], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    relay = RelayProcess(tmp_path, OUTBOX_DATA_DIR=str(data), OUTBOX_LOG_TOPICS="demo.hello")
    relays.append(relay)
    relay.wait_ready(timeout=60)
    url = EmbeddedPostgres(data / "pgdata").running_url()
    assert url is not None
    add_messages(url, "demo.hello", 3)
    wait_until("3 deliveries", lambda: relay.log.count('"delivered message=') == 3)

    relay.signal(signal.SIGTERM)
    assert relay.wait(30) == 0

    said = [r["message"] for r in relay.log_records()]
    assert sum("embedded PostgreSQL" in m and "no OUTBOX_DATABASE_URL" in m for m in said) == 1
    assert not (data / "pgdata" / "postmaster.pid").exists(), "embedded server still running"


def test_controller_needs_a_namespace_or_all_namespaces(pg_conninfo: str) -> None:
    result = run_outbox("controller", OUTBOX_DATABASE_URL=pg_conninfo)

    assert result.returncode == 2
    assert result.stderr.strip() == (
        "outbox controller: POD_NAMESPACE: unset; set it (the downward API) "
        "or pass --all-namespaces"
    )


def test_relay_without_builtin_handlers_starts_and_says_so(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(tmp_path, OUTBOX_DATABASE_URL=db)
    relays.append(relay)

    relay.wait_ready()

    assert any("no built-in handlers enabled" in r["message"] for r in relay.log_records())


def test_without_database_url_or_embedded_postgres_the_relay_says_what_to_do(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "site" / "embedded_postgres"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text("raise ImportError('not installed')\n")

    result = run_outbox(
        "relay",
        OUTBOX_DATA_DIR=str(tmp_path / "data"),
        OUTBOX_LOG_TOPICS="a",
        PYTHONPATH=str(missing.parent),
    )

    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "outbox relay: OUTBOX_DATABASE_URL: unset, and the embedded PostgreSQL is not installed "
        "(pip install 'outbox-relay[embedded]'); set OUTBOX_DATABASE_URL"
    )


def test_an_outage_longer_than_the_liveness_deadline_restarts_nothing(
    relays: list[RelayProcess], tmp_path: Path
) -> None:
    with private_postgres(tmp_path / "outage", relays) as (server, url):
        # Liveness deadline: timeout + 3 intervals (+ the store's wait) is a few seconds.
        settings = {"OUTBOX_TIMEOUT": "1s", "OUTBOX_LEASE": "3s", "RECORDING_DELAY": "0.01"}
        relay = recording_relay(relays, tmp_path, url, **settings)
        relay.wait_ready()
        ids = add_messages(url, recording.TOPIC, 100)
        wait_until("some deliveries", lambda: delivered_count(url) >= 10)

        server.stop()
        wait_until("readiness to fail", lambda: relay.status("/readyz") == 503, timeout=15)
        seen = set()
        deadline = time.monotonic() + 12  # longer than the liveness deadline
        while time.monotonic() < deadline:
            seen.add(relay.status("/healthz"))
            time.sleep(0.5)
        assert seen == {200}, "liveness failed during an outage: Kubernetes would restart it"
        assert relay.status("/readyz") == 503

        started = time.monotonic()
        relay.signal(signal.SIGTERM)
        assert relay.wait(20) == 0
        assert time.monotonic() - started < 10, "SIGTERM waited for the database"
        said = [r["message"] for r in relay.log_records()]
        assert sum(m.startswith("poll failed") for m in said) == 1, "the outage said once"

        assert server.start() == url
        second = recording_relay(relays, tmp_path, url, **settings)
        second.wait_ready()
        wait_until("the outbox to empty", lambda: outbox_empty(url), timeout=60)
        assert set(deliveries(url)) == set(ids), "a message was lost"


def test_a_listen_url_that_fails_says_so_without_its_password(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_LISTEN_URL="postgresql://outbox:hunter3-secret@127.0.0.1:1/x?connect_timeout=1",
        OUTBOX_LOG_TOPICS="orders.placed",
    )
    relays.append(relay)
    relay.wait_ready()
    wait_until("the listener to give up", lambda: "wake-ups lost" in relay.log, timeout=15)

    assert "hunter3" not in relay.log
