"""An upgrade while the application writes: an earlier release's schema with a
backlog, producers committing throughout, one use case inside its transaction.

Shared by the online-migration tests and bench/migrate_stall.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from outbox import new_message
from outbox.postgres import add_sync
from outbox.postgres.queries import migrations
from outbox.postgres.schema import BOOKKEEPING, LOCK_TIMEOUT, RECORD, statements, transactional

BEFORE_INDEX_BUILDS = 6
"""The last migration of the release before migrations 7 and 8 (index builds)."""


def earlier_release(conninfo: str, rows: int, upto: int = BEFORE_INDEX_BUILDS) -> None:
    """Apply the shipped migrations up to ``upto`` and add ``rows`` pending messages."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(BOOKKEEPING)
        for version, name, sql in migrations():
            if version <= upto:
                for part in [sql] if transactional(sql) else statements(sql):
                    conn.execute(part.encode())
                conn.execute(RECORD, {"version": version, "name": name})
        conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
            " SELECT gen_random_uuid(), 'orders.placed', '{}', now(), now()"
            " FROM generate_series(1, %s)",
            (rows,),
        )


@contextmanager
def writing(conninfo: str, *, producers: int = 2, hold: float = 3.0, pace: float = 0.01,
            until_refused: bool = False) -> Iterator[list[float]]:  # fmt: skip
    """Producers commit one message at a time (every ``pace`` s) and one use case
    holds a transaction (a lock a schema change must wait out) for ``hold``
    seconds, while the block runs; yields every commit's duration.

    With ``until_refused``, the use case holds on (at most a minute) until a
    migration has waited for it and given up at least once (lock_timeout ran
    out), whenever the migration gets there: on a slow machine an index build
    scans the backlog for longer than ``hold`` before it waits for older
    transactions.
    """
    waits: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                with conn.transaction():
                    add_sync(conn, new_message("orders.placed", {}))
                waits.append(time.monotonic() - started)
                stop.wait(pace)

    def use_case() -> None:
        with psycopg.connect(conninfo) as conn:
            conn.execute("SELECT count(*) FROM outbox_messages WHERE topic = 'x'")
            stop.wait(hold)
            if until_refused:
                with psycopg.connect(conninfo, autocommit=True) as watch:
                    deadline = time.monotonic() + 60
                    pid = conn.info.backend_pid
                    while not _blocked_by(watch, pid) and time.monotonic() < deadline:
                        stop.wait(0.05)
                # Queued: hold on until its lock_timeout has run out once.
                stop.wait(3 * LOCK_TIMEOUT)

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    threads.append(threading.Thread(target=use_case))
    for t in threads:
        t.start()
    try:
        yield waits
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def _blocked_by(conn: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    """Whether a session waits for a lock the session ``pid`` holds."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
    ).fetchone()
    return bool(row and row[0])


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)]
