"""The ``outbox.django`` app: its migrations create the outbox tables."""

from __future__ import annotations

from django.apps import AppConfig


class OutboxConfig(AppConfig):  # type: ignore[misc]
    name = "outbox.django"
    label = "outbox"
    verbose_name = "Transactional outbox"
