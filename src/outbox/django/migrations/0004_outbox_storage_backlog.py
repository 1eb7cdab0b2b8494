"""Shipped SQL migrations 9 and 10: queue storage parameters and the shared backlog count."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from outbox.django.schema import run_shipped


class Migration(migrations.Migration):  # type: ignore[misc]
    # Each shipped migration is a transaction of its own (outbox.django.schema).
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("outbox", "0003_outbox_topic_index")]
    operations = run_shipped(first=9, last=10)
