"""Shipped SQL migration 15: who may reroute a topic."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0007_outbox_headers")]
    operations = run_shipped(first=15, last=15)
