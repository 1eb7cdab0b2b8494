"""Create or upgrade the outbox schema while producers keep writing.

Migrations are numbered SQL files applied in order, each in its own
transaction together with its row in outbox_schema_migrations; a file that
starts with ``-- outbox: no transaction`` (index builds, which run
CONCURRENTLY) runs statement by statement instead, then is recorded.

Producers insert inside their own transactions, so a migration must never
queue for a lock with no end: every statement runs under a short
``lock_timeout`` (a producer waits at most that long behind it), and one that
times out is rolled back and tried again after a backoff, until ``wait`` is
spent; then migrate fails in one line naming the sessions in the way. A
session advisory lock serialises concurrent runs (several pods starting at
once), taken with the same bound: the second waits, then finds nothing to do.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Collection
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql as pgsql

from outbox.errors import MigrationBlocked, MigrationRefused
from outbox.postgres.connection import connect
from outbox.postgres.queries import QUERIES, migrations

__all__ = [
    "BLOCKERS",
    "BOOKKEEPING",
    "FOREIGN",
    "GRANTS",
    "INVALID_INDEXES",
    "LOCK_KEY",
    "LOCK_TIMEOUT",
    "MIGRATE_WAIT",
    "RECORD",
    "TRIGGERS",
    "grants_sql",
    "index_names",
    "migrate",
    "migrations_sql",
    "pending",
    "refusal",
    "statements",
]

log = logging.getLogger("outbox.postgres")

# Any constant works as long as every outbox migrator uses the same one.
LOCK_KEY = 0x6F7574626F78  # "outbox"
LOCK_TIMEOUT = 0.8
"""Seconds one statement may wait for a lock (and producers behind it)."""
MIGRATE_WAIT = 60.0
"""Seconds one run keeps retrying a lock before it gives up."""
_NO_TRANSACTION = "-- outbox: no transaction"
_COMMENT_LINE = re.compile(r"^\s*--.*$", re.MULTILINE)


BOOKKEEPING = QUERIES["schema_bookkeeping"]
RECORD = QUERIES["schema_record"]
"""Records one applied migration: parameters ``{"version": ..., "name": ...}``."""
BLOCKERS = QUERIES["schema_blockers"]
"""Who holds the locks a migration waits for: parameter lock (LOCK_KEY)."""
INVALID_INDEXES = QUERIES["schema_invalid_indexes"]
FOREIGN = QUERIES["schema_foreign"]
"""Outbox objects another role owns: (kind, name, owner) rows."""
TRIGGERS = QUERIES["schema_triggers"]
"""Triggers on outbox tables not named in the parameter allowed: (trigger, table) rows."""
_INDEX_NAME = re.compile(r"INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)


def transactional(sql: str) -> bool:
    """Whether a shipped migration runs in one transaction (most) or statement by statement."""
    return not sql.lstrip().startswith(_NO_TRANSACTION)


def statements(sql: str) -> list[str]:
    """The statements of a migration file (no comments; split at ``;`` line ends
    outside ``$$`` quotes, so a DO block is one statement)."""
    body = _COMMENT_LINE.sub("", sql)
    out, current = [], ""
    for n, part in enumerate(body.split("$$")):
        if n % 2:  # inside a $$-quoted body
            current += "$$" + part + "$$"
            continue
        pieces = re.split(r";\s*$", part, flags=re.M)
        current += pieces[0]
        for piece in pieces[1:]:
            out.append(current)
            current = piece
    out.append(current)
    return [part.strip() for part in out if part.strip()]


async def migrate(
    conninfo: str,
    *,
    wait: float = MIGRATE_WAIT,
    lock_timeout: float = LOCK_TIMEOUT,
    allow_triggers: Collection[str] = (),
) -> list[int]:
    """Apply the migrations ``conninfo``'s database lacks; return the versions applied.

    Raises MigrationBlocked when a lock stays out of reach for ``wait`` seconds,
    and MigrationRefused, before anything is applied and again inside each
    migration, when an outbox object belongs to another role than the one
    migrating, or an outbox table has a trigger not named in ``allow_triggers``.
    """
    allowed = tuple(sorted(allow_triggers))
    applied: list[int] = []
    async with await connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            QUERIES["schema_lock_timeout"],
            {"timeout": f"{int(lock_timeout * 1000)}ms", "local": False},
        )
        await _lock(conn, wait)
        try:
            # A role without DDL rights may run migrate when nothing is left to do.
            cur = await conn.execute(QUERIES["schema_missing"])
            if (await cur.fetchone() or (True,))[0]:
                await _retrying(conn, "outbox_schema_migrations", wait, [BOOKKEEPING], None)
            cur = await conn.execute(QUERIES["schema_applied"])
            done = {row[0] for row in await cur.fetchall()}
            todo = [m for m in migrations() if m[0] not in done]
            if todo:  # before the first statement, and again inside each migration
                await _owned(conn, f"migration {todo[0][0]:04d}_{todo[0][1]}", allowed)
            for version, name, sql in todo:
                what = f"migration {version:04d}_{name}"
                record = {"version": version, "name": name}
                if transactional(sql):
                    await _retrying(conn, what, wait, [sql], record, allowed)
                else:
                    for statement in statements(sql):
                        await _drop_invalid(conn, statement)
                        await _retrying(conn, what, wait, [statement], None, allowed)
                    await _owned(conn, what, allowed)
                    await conn.execute(RECORD, record)
                log.info("applied migration %04d_%s", version, name)
                applied.append(version)
        finally:
            cur = await conn.execute(QUERIES["schema_unlock"], {"lock": LOCK_KEY})
            row = await cur.fetchone()
            if not row or not row[0]:
                log.error("the migration lock was not held at the end: %s", _POOLED)
    return applied


_POOLED = (
    "this connection's statements run in different server sessions (a transaction "
    "pooler, like PgBouncer with pool_mode=transaction, sits in between), and migrating "
    "needs a session of its own: give migrate a direct or session-mode URL"
)


async def _session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Refuse a connection whose consecutive statements run in different sessions.

    The migration lock is a session's, and index builds run outside a
    transaction: behind a transaction pooler the lock would be taken on one
    server connection and left there, held, for the next migrate to wait on.
    """
    token = secrets.token_hex(8)
    for _ in range(3):
        await conn.execute(QUERIES["schema_session_mark"], {"token": token})
        cur = await conn.execute(QUERIES["schema_session_read"])
        row = await cur.fetchone()
        if not row or row[0] != token:
            raise MigrationRefused(_POOLED)


async def _lock(conn: psycopg.AsyncConnection[Any], wait: float) -> None:
    """Take the migration lock within ``wait`` seconds, saying once that it waits."""
    await _session(conn)
    started = time.monotonic()
    told = False
    while True:
        cur = await conn.execute(QUERIES["schema_lock_try"], {"lock": LOCK_KEY})
        row = await cur.fetchone()
        if row and row[0]:
            cur = await conn.execute(QUERIES["schema_lock_held"], {"lock": LOCK_KEY})
            held = await cur.fetchone()
            if not held or not held[0]:
                raise MigrationRefused(_POOLED)
            return
        waited = time.monotonic() - started
        if waited >= wait:
            raise MigrationBlocked("the migration lock", waited, await _blockers(conn))
        if not told:
            told = True
            log.warning(
                "another outbox migrate holds the migration lock; waiting up to %.0fs", wait
            )
        await asyncio.sleep(min(0.5, wait - waited))


async def _retrying(
    conn: psycopg.AsyncConnection[Any],
    what: str,
    wait: float,
    sqls: list[str],
    record: dict[str, Any] | None,
    allowed: tuple[str, ...] = (),
) -> None:
    """Run ``sqls`` (and the bookkeeping row) in one transaction, retrying lock timeouts."""
    started = time.monotonic()
    delay = 0.25
    while True:
        try:
            async with conn.transaction() if record is not None or len(sqls) > 1 else _none():
                for sql in sqls:
                    await conn.execute(sql.encode())
                if record is not None:
                    await _owned(conn, what, allowed)
                    await conn.execute(RECORD, record)
            return
        except psycopg.errors.LockNotAvailable:
            waited = time.monotonic() - started
            blockers = await _blockers(conn)
            if waited + delay >= wait:
                raise MigrationBlocked(what, waited, blockers) from None
            log.warning(
                "%s: a lock is held by %s; trying again in %.1fs", what, blockers or "?", delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


class _none:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _owned(conn: psycopg.AsyncConnection[Any], what: str, allowed: tuple[str, ...]) -> None:
    """Refuse outbox objects the migrating role does not own, and triggers on outbox
    tables not named in ``allowed`` (inside a migration's transaction, so nothing
    of it is recorded): ``IF NOT EXISTS`` would otherwise adopt a table someone
    else created first, triggers and all."""
    cur = await conn.execute(FOREIGN, {})
    foreign = await cur.fetchall()
    cur = await conn.execute(TRIGGERS, {"allowed": list(allowed)})
    refused = refusal(what, foreign, await cur.fetchall())
    if refused is not None:
        raise refused


def refusal(
    what: str, foreign: list[tuple[str, str, str]], triggers: list[tuple[str, str]]
) -> MigrationRefused | None:
    """What migrate says of the rows of FOREIGN and TRIGGERS: one line naming the
    first object and its owner (or trigger and table); None when both are empty."""
    if foreign:
        kind, name, owner = foreign[0]
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        return MigrationRefused(
            f"{what}: {kind} {name} is owned by {owner}, not by the migrating role{more}; "
            "outbox objects are created by the role that runs migrate: drop it, or "
            "migrate as its owner"
        )
    if triggers:
        trigger, table = triggers[0]
        more = f" (and {len(triggers) - 1} more)" if len(triggers) > 1 else ""
        return MigrationRefused(
            f"{what}: trigger {trigger} on {table} was not created by outbox-relay{more} "
            "and would see every message; drop it, or allow it by name "
            f"(outbox migrate --allow-trigger {trigger})"
        )
    return None


async def _blockers(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute(BLOCKERS, {"lock": LOCK_KEY})
    rows = await cur.fetchall()
    return ", ".join(f"pid {pid} ({state}, {age}s)" for pid, state, age in rows)


def index_names(statement: str) -> list[str]:
    """The indexes a CONCURRENTLY build in ``statement`` makes (none for a DROP)."""
    if statement.lstrip().upper().startswith("DROP"):
        return []
    return _INDEX_NAME.findall(statement)


async def _drop_invalid(conn: psycopg.AsyncConnection[Any], statement: str) -> None:
    names = index_names(statement)
    if not names:
        return
    cur = await conn.execute(INVALID_INDEXES, {"names": names})
    for (name,) in await cur.fetchall():
        log.warning("dropping the invalid index %s a failed build left behind", name)
        drop = pgsql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(pgsql.Identifier(name))
        await conn.execute(drop)


async def pending(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    """The shipped migrations that ``conn``'s database has not applied yet."""
    cur = await conn.execute(QUERIES["schema_missing"])
    row = await cur.fetchone()
    done: set[int] = set()
    if row and not row[0]:
        cur = await conn.execute(QUERIES["schema_applied"])
        done = {r[0] for r in await cur.fetchall()}
    return [version for version, _, _ in migrations() if version not in done]


def migrations_sql() -> str:
    """Every migration's DDL in order, for teams whose own migrations own the schema.

    A psql script: each migration runs only where ``outbox_schema_migrations``
    does not record it (psql's ``\\if``), so the script can be applied to a
    database that has some of it, or all of it, again (a migration may not
    run twice: an index built CONCURRENTLY on what is now a partitioned
    table). The bookkeeping table is filled in too, so `outbox migrate` and
    the relays' start-up check agree with what was applied. Each migration
    is a transaction of its own, but for index builds, which run
    CONCURRENTLY and so outside one; every statement waits at most a few
    seconds for a lock.
    """
    parts = [
        "-- The outbox schema, every migration in order, for psql: each runs only\n"
        "-- where outbox_schema_migrations does not record it. Safe to apply twice.\n"
        "SET lock_timeout = '5s';\n",
        BOOKKEEPING + "\n",
    ]
    for version, name, sql in migrations():
        record = (
            "INSERT INTO outbox_schema_migrations (version, name) "
            f"VALUES ({version}, '{name}') ON CONFLICT (version) DO NOTHING;\n"
        )
        todo = (
            "SELECT NOT EXISTS (SELECT 1 FROM outbox_schema_migrations "
            f"WHERE version = {version}) AS outbox_todo \\gset\n\\if :outbox_todo\n"
        )
        if transactional(sql):
            body = f"BEGIN;\n{sql.strip()}\n{record}COMMIT;\n"
            parts.append(f"\n-- {version:04d}_{name}\n{todo}{body}\\endif\n")
        else:
            body = "".join(f"{statement};\n" for statement in statements(sql))
            parts.append(
                f"\n-- {version:04d}_{name} (outside a transaction)\n{todo}{body}{record}\\endif\n"
            )
    return "".join(parts)


# What each role of a least-privilege setup needs, table by table. The owner
# (the role that runs migrate) needs CREATE on the schema and owns everything.
GRANTS: dict[str, dict[str, str]] = {
    "relay": {
        "outbox_messages": "SELECT, UPDATE, DELETE",
        # The ring (outbox.postgres.ring): its shape, and emptying its slots,
        # whose rows the relay may DELETE already.
        "outbox_ring": "SELECT",
        "outbox_messages_0": "TRUNCATE",
        "outbox_messages_1": "TRUNCATE",
        "outbox_topics": "SELECT",
        "outbox_schema_migrations": "SELECT",
        "outbox_relays": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_unserved": "SELECT, INSERT, DELETE",
        "outbox_backlog": "SELECT, INSERT, UPDATE",
    },
    "producer": {"outbox_messages": "INSERT"},
    # The controller counts the backlog from three columns: never a payload.
    "controller": {
        "outbox_messages": "SELECT (topic, created_at, buried_at)",
        "outbox_topics": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_schema_migrations": "SELECT",
        "outbox_relays": "SELECT",
        "outbox_backlog": "SELECT, INSERT, UPDATE",
    },
    # `outbox ui` read-only: every read, and the shared backlog count it may
    # take when the relays' is stale; an operating console is an operator.
    "console": {
        "outbox_messages": "SELECT",
        "outbox_topics": "SELECT",
        "outbox_schema_migrations": "SELECT",
        "outbox_relays": "SELECT",
        "outbox_backlog": "SELECT, INSERT, UPDATE",
    },
    # `outbox buried`, `outbox topics`, `outbox relays`; an operating `outbox ui`.
    "operator": {
        "outbox_messages": "SELECT, UPDATE, DELETE",
        "outbox_topics": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_schema_migrations": "SELECT",
        "outbox_relays": "SELECT",
        "outbox_backlog": "SELECT, INSERT, UPDATE",
    },
}
_ROLE = re.compile(r"^[a-z_][a-z0-9_$]*$")


def grants_sql(roles: dict[str, str], schema: str = "public") -> str:
    """GRANT statements giving each ``{kind: role}`` what its kind needs, and no more."""
    for name in (*roles.values(), schema):
        if not _ROLE.match(name):
            raise ValueError(f"{name!r} is not a plain lower-case SQL name")
    out = [f"-- Least-privilege grants for the outbox tables in schema {schema}.\n"]
    for kind, role in roles.items():
        if kind not in GRANTS:
            raise ValueError(f"{kind!r} is not one of {', '.join(GRANTS)}")
        out.append(f"\n-- {kind}\nGRANT USAGE ON SCHEMA {schema} TO {role};\n")
        out.extend(
            f"GRANT {privileges} ON {schema}.{table} TO {role};\n"
            for table, privileges in GRANTS[kind].items()
        )
    return "".join(out)
