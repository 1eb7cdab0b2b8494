"""Django migration operations that run the outbox's shipped SQL migrations."""

from __future__ import annotations

from django.db import migrations

from outbox.postgres.queries import migrations as shipped
from outbox.postgres.schema import BOOKKEEPING

__all__ = ["run_shipped"]


def run_shipped(*, first: int, last: int, bookkeeping: bool = False) -> list[migrations.RunSQL]:
    """RunSQL operations for the shipped migrations ``first`` to ``last``, each recorded.

    Each is recorded in outbox_schema_migrations, as `outbox migrate` records it,
    so relays' start-up check agrees with what Django applied.
    """
    ops = [migrations.RunSQL(BOOKKEEPING, migrations.RunSQL.noop)] if bookkeeping else []
    for version, name, sql in shipped():
        if not first <= version <= last:
            continue
        ops.append(migrations.RunSQL(sql, migrations.RunSQL.noop))
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
