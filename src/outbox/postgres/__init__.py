"""PostgreSQL backend: the store, its pool helper and schema migrations."""

from __future__ import annotations

from outbox.postgres.migrate import migrate, pending
from outbox.postgres.store import PostgresStore, connect_pool

__all__ = ["PostgresStore", "connect_pool", "migrate", "pending"]
