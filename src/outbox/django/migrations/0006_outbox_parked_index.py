"""Shipped SQL migration 13: the index of parked messages (key_unpark's)."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0005_outbox_keys")]
    operations = run_shipped(first=13, last=13)
