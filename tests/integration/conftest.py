"""Fixtures for tests that run real `outbox` processes."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox.postgres import migrate
from outbox.postgres.ring import set_period
from tests.integration import recording
from tests.integration.hooks import Receiver, serving
from tests.integration.process import RelayProcess, query


@pytest.fixture
def db(pg_conninfo: str) -> str:
    """A migrated schema with the recording handler's table, and a test-sized
    ring: slots of a second, so the relays' rotation moves and truncates under
    every process test (kills, stalls, skewed clocks, keys) as it would over
    minutes of production."""
    anyio.run(migrate, pg_conninfo)
    query(pg_conninfo, recording.DDL)
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        set_period(conn, 1)
    return pg_conninfo


@pytest.fixture
def relays() -> Iterator[list[RelayProcess]]:
    """Relay processes a test starts; killed at the end (a stopped one is resumed first)."""
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        if relay.proc.poll() is None:
            relay.signal(signal.SIGCONT)
        relay.stop()


@pytest.fixture
def scratch_db(postgres_url: str) -> Iterator[str]:
    """A database of its own (behind a pooler, a search_path cannot be set per test)."""
    name = f"outbox_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(postgres_url, dbname=name)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """An HTTP receiver on a loopback port (tests.integration.hooks)."""
    async with serving(Receiver()) as r:
        yield r
