"""Shipped SQL migration 19: messages due later beside the shared backlog measurement."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0009_outbox_ring")]
    operations = run_shipped(first=19, last=19)
