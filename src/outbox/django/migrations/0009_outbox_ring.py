"""Shipped SQL migrations 16-18: the outbox becomes a ring of partitions."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0008_outbox_reroute")]
    operations = run_shipped(first=16, last=18)
