"""Fixtures shared by every tier: the event loop backend and a real PostgreSQL.

PostgreSQL comes from, in order: OUTBOX_TEST_DATABASE_URL; a testcontainers
container when a Docker engine answers; an embedded server started once per
session. Each test that asks for one gets a fresh schema of its own, so tests
run in any order and never see each other's rows.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.service.embedded import EmbeddedPostgres


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def _docker_answers() -> bool:
    """Whether a Docker engine answers, without leaving a socket behind."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a remote engine: let testcontainers try it
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(host.removeprefix("unix://"))
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/1.")
    except OSError:
        return False


def _docker_postgres() -> Iterator[str] | None:
    if not _docker_answers():
        return None
    from testcontainers.postgres import PostgresContainer

    def run() -> Iterator[str]:
        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()

    return run()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server URL for the whole session (a database of each pytest-xdist
    worker's own: LISTEN/NOTIFY channels are per database)."""
    url = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if url:
        yield from _own_database(url)
        return
    container = _docker_postgres()
    if container is not None:
        for found in container:
            yield from _own_database(found)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-test-") as tmp:
        os.chmod(tmp, 0o755)  # as root, the server runs as its own user
        with EmbeddedPostgres(Path(tmp) / "pgdata", delete=True) as server:
            yield server.url


def _own_database(url: str) -> Iterator[str]:
    """``url`` itself, or under pytest-xdist a database of this worker's own on its
    server (dropped afterwards), so workers never hear each other's wake-ups."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        yield url
        return
    name = f"{conninfo_to_dict(url).get('dbname') or 'postgres'}_{worker}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(url, dbname=name)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def fresh_schema(postgres_url: str) -> Iterator[str]:
    """Conninfo whose search_path is a fresh, empty schema; dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    options = conninfo_to_dict(postgres_url).get("options") or ""
    try:
        yield make_conninfo(postgres_url, options=f"{options} -c search_path={schema}".strip())
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def pg_conninfo(postgres_url: str) -> Iterator[str]:
    """Conninfo whose search_path is a fresh, empty schema; dropped afterwards."""
    with fresh_schema(postgres_url) as conninfo:
        yield conninfo


@pytest.fixture
async def pg_store(pg_conninfo: str) -> AsyncIterator[PostgresStore]:
    """A migrated PostgresStore in its own schema."""
    await migrate(pg_conninfo)
    async with connect_pool(pg_conninfo, min_size=1, max_size=8) as pool:
        yield PostgresStore(pool)


@pytest.fixture
def max_payload(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set OUTBOX_MAX_PAYLOAD as an application would before its first message
    (producers read it once a process); the default again afterwards."""
    from outbox.message import max_payload as limit

    def set_limit(text: str) -> None:
        monkeypatch.setenv("OUTBOX_MAX_PAYLOAD", text)
        limit.cache_clear()

    yield set_limit
    limit.cache_clear()
