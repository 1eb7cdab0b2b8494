"""Shipped SQL migration 7: the claim index holds only rows no lease holds."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped, shipped_atomic


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0001_outbox_schema")]
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = shipped_atomic(first=7, last=7)
    operations = run_shipped(first=7, last=7)
