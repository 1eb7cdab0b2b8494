"""Shipped SQL migrations 11 and 12: ordering per key (columns, then the key index)."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0004_outbox_storage_backlog")]
    operations = run_shipped(first=11, last=12)
