"""Create or upgrade the outbox schema.

Migrations are numbered SQL files applied in order, each in its own
transaction together with its row in outbox_schema_migrations. A session
advisory lock serialises concurrent runs (several pods starting at once): the
second waits, then finds nothing left to do.
"""

from __future__ import annotations

import logging
from typing import Any, LiteralString

import psycopg

from outbox.postgres.queries import migrations

__all__ = ["migrate", "migrations_sql", "pending"]

log = logging.getLogger("outbox.postgres")

# Any constant works as long as every outbox migrator uses the same one.
_LOCK_KEY = 0x6F7574626F78  # "outbox"


BOOKKEEPING: LiteralString = """
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def migrate(conninfo: str) -> list[int]:
    """Apply the migrations ``conninfo``'s database lacks; return the versions applied."""
    applied: list[int] = []
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            await conn.execute(BOOKKEEPING)
            cur = await conn.execute("SELECT version FROM outbox_schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            for version, name, sql in migrations():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO outbox_schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
                log.info("applied migration %04d_%s", version, name)
                applied.append(version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied


async def pending(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    """The shipped migrations that ``conn``'s database has not applied yet."""
    cur = await conn.execute("SELECT to_regclass('outbox_schema_migrations') IS NOT NULL")
    row = await cur.fetchone()
    done: set[int] = set()
    if row and row[0]:
        cur = await conn.execute("SELECT version FROM outbox_schema_migrations")
        done = {r[0] for r in await cur.fetchall()}
    return [version for version, _, _ in migrations() if version not in done]


def migrations_sql() -> str:
    """Every migration's DDL in order, for teams whose own migrations own the schema.

    Each statement is idempotent (IF NOT EXISTS), so the script can be applied
    to a database that already has some of it; the bookkeeping table
    ``outbox_schema_migrations`` is filled in too, so `outbox migrate` and the
    relays' start-up check agree with what was applied.
    """
    parts = [
        "-- The outbox schema, every migration in order. Idempotent: safe to apply twice.\n"
        "BEGIN;\n",
        BOOKKEEPING.strip() + ";\n",
    ]
    for version, name, sql in migrations():
        parts.append(f"\n-- {version:04d}_{name}\n{sql.strip()}\n")
        parts.append(
            "INSERT INTO outbox_schema_migrations (version, name) "
            f"VALUES ({version}, '{name}') ON CONFLICT (version) DO NOTHING;\n"
        )
    parts.append("COMMIT;\n")
    return "".join(parts)
