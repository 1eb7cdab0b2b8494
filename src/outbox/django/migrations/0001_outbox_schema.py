"""The outbox schema as Django migrations: the same SQL `outbox migrate` runs.

Each shipped migration file runs in order (its statements are idempotent) and
is recorded in outbox_schema_migrations, so relays' start-up check and a later
`outbox migrate` agree with what Django applied. A release that ships new SQL
migrations ships a Django migration that runs them too.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations = run_shipped(first=1, last=6, bookkeeping=True)
