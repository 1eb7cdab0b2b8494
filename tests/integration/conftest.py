"""Fixtures for tests that run real `outbox` processes."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import anyio
import pytest

from outbox.postgres import migrate
from tests.integration import recording
from tests.integration.process import RelayProcess, query


@pytest.fixture
def db(pg_conninfo: str) -> str:
    """A migrated schema with the recording handler's table."""
    anyio.run(migrate, pg_conninfo)
    query(pg_conninfo, recording.DDL)
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
