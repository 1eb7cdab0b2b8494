"""Django migration operations that run the outbox's shipped SQL migrations."""

from __future__ import annotations

from django.db import migrations

from outbox.postgres.queries import migrations as shipped
from outbox.postgres.schema import BOOKKEEPING, statements, transactional

__all__ = ["run_shipped", "shipped_atomic"]


def run_shipped(*, first: int, last: int, bookkeeping: bool = False) -> list[migrations.RunSQL]:
    """RunSQL operations for the shipped migrations ``first`` to ``last``, each recorded.

    Each is recorded in outbox_schema_migrations, as `outbox migrate` records it,
    so relays' start-up check agrees with what Django applied.

    A migration shipped to run outside a transaction (CONCURRENTLY index
    builds) is one RunSQL per statement; the Django migration holding it says
    ``atomic = False`` (``shipped_atomic`` tells).
    """
    ops = [migrations.RunSQL(BOOKKEEPING, migrations.RunSQL.noop)] if bookkeeping else []
    for version, name, sql in shipped():
        if not first <= version <= last:
            continue
        if transactional(sql):
            ops.append(migrations.RunSQL(sql, migrations.RunSQL.noop))
        else:
            ops.extend(migrations.RunSQL(s, migrations.RunSQL.noop) for s in statements(sql))
        ops.append(
            migrations.RunSQL(
                [
                    (
                        "INSERT INTO outbox_schema_migrations (version, name) VALUES (%s, %s) "
                        "ON CONFLICT (version) DO NOTHING",
                        [version, name],
                    )
                ],
                migrations.RunSQL.noop,
            )
        )
    return ops


def shipped_atomic(*, first: int, last: int) -> bool:
    """Whether the shipped migrations ``first`` to ``last`` may run in one transaction."""
    return all(transactional(sql) for v, _, sql in shipped() if first <= v <= last)
