"""`outbox migrate` and `outbox migrate --sql`: only outbox objects, the same schema both ways."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg

from outbox.postgres import migrate
from tests.integration.process import run_outbox
from tests.tools import require


def schema_of(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Tables (columns), indexes and constraints of the connection's current schema."""
    found: dict[str, Any] = {}
    for table, column, kind, nullable, default in conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = current_schema()"
        " ORDER BY table_name, ordinal_position"
    ):
        found.setdefault(f"table {table}", []).append((column, kind, nullable, default))
    for name, definition in conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
    ):
        found[f"index {name}"] = definition.replace(f"{_schema(conn)}.", "")
    for name, definition in conn.execute(
        "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c"
        " JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = current_schema()"
    ):
        found[f"constraint {name}"] = definition
    for name, options in conn.execute(
        "SELECT c.relname, c.reloptions FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.reloptions IS NOT NULL"
    ):
        found[f"options {name}"] = sorted(options)
    for name, kind in conn.execute(
        "SELECT p.proname, p.prokind FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = current_schema()"
    ):
        found[f"function {name}"] = kind
    return found


def _schema(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_schema()").fetchone()
    assert row is not None
    return str(row[0])


async def test_migrate_creates_only_outbox_objects(pg_conninfo: str) -> None:
    await migrate(pg_conninfo)

    with psycopg.connect(pg_conninfo) as conn:
        names = {key.split(" ", 1)[1] for key in schema_of(conn)}
    assert names
    assert all(name.startswith("outbox") for name in names), sorted(names)


async def test_migrate_leaves_an_applications_own_tables_alone(pg_conninfo: str) -> None:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE user_accounts (login text PRIMARY KEY, karma int)")
        conn.execute("INSERT INTO user_accounts VALUES ('ana', 3)")
        before = schema_of(conn)

    await migrate(pg_conninfo)

    with psycopg.connect(pg_conninfo) as conn:
        after = schema_of(conn)
        assert conn.execute("SELECT * FROM user_accounts").fetchall() == [("ana", 3)]
    mine = {k: v for k, v in after.items() if "user_accounts" in k}
    assert mine == before


def test_migrate_sql_applied_by_psql_gives_the_same_schema(
    pg_conninfo: str, postgres_url: str
) -> None:
    psql = require("psql", "postgresql-client")  # on CI a missing psql fails, never skips
    printed = run_outbox("migrate", "--sql")
    assert printed.returncode == 0, printed.stderr
    assert "CREATE TABLE IF NOT EXISTS outbox_messages" in printed.stdout

    for _ in range(2):  # idempotent: applying it twice changes nothing
        applied = subprocess.run(
            [psql, "-v", "ON_ERROR_STOP=1", "-q", pg_conninfo],
            input=printed.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
    with psycopg.connect(pg_conninfo) as conn:
        by_psql = schema_of(conn)
        versions = [r[0] for r in conn.execute("SELECT version FROM outbox_schema_migrations")]

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS migrate_compare")
    other = pg_conninfo.replace(_search_path(pg_conninfo), "migrate_compare")
    try:
        assert run_outbox("migrate", OUTBOX_DATABASE_URL=other).returncode == 0
        with psycopg.connect(other) as conn:
            by_migrate = schema_of(conn)
        assert by_psql == by_migrate
        assert run_outbox("migrate", OUTBOX_DATABASE_URL=pg_conninfo).stderr.count("applied") == 1
        assert versions
        assert sorted(versions) == versions
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA migrate_compare CASCADE")


def _search_path(conninfo: str) -> str:
    return conninfo.split("search_path=")[1].split()[0].strip("'")
