"""Shipped SQL migration 8: the claim index by topic."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped, shipped_atomic


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0002_outbox_ready_index")]
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = shipped_atomic(first=8, last=8)
    operations = run_shipped(first=8, last=8)
