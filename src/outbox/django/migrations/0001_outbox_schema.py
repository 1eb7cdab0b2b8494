"""The outbox schema as Django migrations: the same SQL `outbox migrate` runs.

Each shipped migration file runs in order (its statements are idempotent) and
is recorded in outbox_schema_migrations, so relays' start-up check and a later
`outbox migrate` agree with what Django applied. A release that ships new SQL
migrations ships a Django migration that runs them too.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.postgres.queries import migrations as shipped
from outbox.postgres.schema import BOOKKEEPING


def _operations() -> list[migrations.RunSQL]:
    ops = [migrations.RunSQL(BOOKKEEPING, migrations.RunSQL.noop)]
    for version, name, sql in shipped():
        if version > 6:  # later files belong to later Django migrations
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


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations = _operations()
