"""Django migration operations that run the outbox's shipped SQL migrations.

They run as ``outbox migrate`` runs them, so ``manage.py migrate`` is as safe
while producers write: every statement under a short ``lock_timeout``, a
migration that times out rolled back and tried again with backoff until
MIGRATE_WAIT is spent (then MigrationBlocked names the sessions in the way),
index builds CONCURRENTLY outside a transaction, each migration recorded in
outbox_schema_migrations so relays' start-up check agrees. The Django
migrations holding them say ``atomic = False``: each shipped migration is a
transaction of its own, which a retry can roll back whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, LiteralString

from django.db import migrations, transaction
from django.db.utils import OperationalError

from outbox.errors import MigrationBlocked
from outbox.postgres.queries import QUERIES
from outbox.postgres.queries import migrations as shipped
from outbox.postgres.schema import (
    BLOCKERS,
    BOOKKEEPING,
    FOREIGN,
    INVALID_INDEXES,
    LOCK_KEY,
    LOCK_TIMEOUT,
    MIGRATE_WAIT,
    RECORD,
    TRIGGERS,
    index_names,
    refusal,
    statements,
    transactional,
)

__all__ = ["run_shipped"]

log = logging.getLogger("outbox.postgres")

_LOCK_NOT_AVAILABLE = "55P03"


def run_shipped(*, first: int, last: int, bookkeeping: bool = False) -> list[migrations.RunPython]:
    """The operations that apply the shipped migrations ``first`` to ``last``, each recorded."""
    ops = []
    if bookkeeping:
        ops.append(
            _run("outbox_schema_migrations", lambda c: _retrying(c, "bookkeeping", [BOOKKEEPING]))
        )
    for version, name, sql in shipped():
        if first <= version <= last:
            ops.append(_run(f"{version:04d}_{name}", _applier(version, name, sql)))
    return ops


def _run(name: str, apply: Callable[[Any], None]) -> migrations.RunPython:
    def forward(apps: Any, schema_editor: Any) -> None:
        apply(schema_editor.connection)

    forward.__name__ = f"apply_{name}"
    return migrations.RunPython(forward, migrations.RunPython.noop, atomic=False)


def _applier(version: int, name: str, sql: LiteralString) -> Callable[[Any], None]:
    what = f"migration {version:04d}_{name}"

    def apply(connection: Any) -> None:
        if _recorded(connection, version):  # applied by `outbox migrate` already
            return
        if transactional(sql):
            _retrying(connection, what, [sql], {"version": version, "name": name})
            return
        for statement in statements(sql):
            _drop_invalid(connection, statement)
            _retrying(connection, what, [statement], None, atomic=False)
        with connection.cursor() as cur:
            _owned(cur, what)
            cur.execute(RECORD, {"version": version, "name": name})

    return apply


def _recorded(connection: Any, version: int) -> bool:
    """Whether outbox_schema_migrations records ``version`` (an earlier migration
    may be impossible to run again: an index built CONCURRENTLY on what is now
    a partitioned table)."""
    with connection.cursor() as cur:
        cur.execute(QUERIES["schema_missing"])
        row = cur.fetchone()
        if not row or row[0]:
            return False
        cur.execute(QUERIES["schema_applied"])
        return version in {r[0] for r in cur.fetchall()}


def _retrying(
    connection: Any,
    what: str,
    sqls: list[str],
    record: dict[str, Any] | None = None,
    *,
    atomic: bool = True,
) -> None:
    started = time.monotonic()
    delay = 0.25
    timeout = f"{int(LOCK_TIMEOUT * 1000)}ms"
    while True:
        try:
            if atomic:
                with transaction.atomic(using=connection.alias), connection.cursor() as cur:
                    cur.execute(QUERIES["schema_lock_timeout"], {"timeout": timeout, "local": True})
                    for sql in sqls:
                        cur.execute(sql)
                    if record is not None:
                        _owned(cur, what)
                        cur.execute(RECORD, record)
            else:
                with connection.cursor() as cur:
                    cur.execute(
                        QUERIES["schema_lock_timeout"], {"timeout": timeout, "local": False}
                    )
                    try:
                        for sql in sqls:
                            cur.execute(sql)
                    finally:
                        cur.execute(QUERIES["schema_lock_timeout_reset"])
            return
        except OperationalError as exc:
            cause = exc.__cause__
            code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
            if code != _LOCK_NOT_AVAILABLE:
                raise
            waited = time.monotonic() - started
            blockers = _blockers(connection)
            if waited + delay >= MIGRATE_WAIT:
                raise MigrationBlocked(what, waited, blockers) from None
            log.warning(
                "%s: a lock is held by %s; trying again in %.1fs", what, blockers or "?", delay
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _owned(cur: Any, what: str) -> None:
    """Refuse what `outbox migrate` refuses (outbox.postgres.schema): outbox objects
    another role owns, and triggers on outbox tables not named in the setting
    OUTBOX_ALLOW_TRIGGERS (a list of trigger names)."""
    from django.conf import settings

    cur.execute(FOREIGN, {})
    foreign = cur.fetchall()
    allowed = sorted(getattr(settings, "OUTBOX_ALLOW_TRIGGERS", ()))
    cur.execute(TRIGGERS, {"allowed": allowed})
    refused = refusal(what, foreign, cur.fetchall())
    if refused is not None:
        raise refused


def _blockers(connection: Any) -> str:
    with connection.cursor() as cur:
        cur.execute(BLOCKERS, {"lock": LOCK_KEY})
        rows = cur.fetchall()
    return ", ".join(f"pid {pid} ({state}, {age}s)" for pid, state, age in rows)


def _drop_invalid(connection: Any, statement: str) -> None:
    names = index_names(statement)
    if not names:
        return
    with connection.cursor() as cur:
        cur.execute(INVALID_INDEXES, {"names": names})
        for (name,) in cur.fetchall():
            log.warning("dropping the invalid index %s a failed build left behind", name)
            cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(name)}")
