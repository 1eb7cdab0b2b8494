"""PostgreSQL: ``add``/``add_sync`` for producers; the store, pool and migrations for relays.

``import outbox.postgres`` is light: the store (psycopg_pool, anyio) and the
migrations load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.lazy import loader
from outbox.postgres.producer import (
    add,
    add_sync,
    transaction,
    transaction_sync,
    wake,
    wake_sync,
)

if TYPE_CHECKING:
    from outbox.postgres.pool import connect_pool
    from outbox.postgres.schema import migrate, migrations_sql, pending
    from outbox.postgres.store import PostgresStore

__all__ = [
    "PostgresStore",
    "add",
    "add_sync",
    "connect_pool",
    "migrate",
    "migrations_sql",
    "pending",
    "transaction",
    "transaction_sync",
    "wake",
    "wake_sync",
]

__getattr__ = loader(
    __name__,
    {
        "PostgresStore": "outbox.postgres.store",
        "connect_pool": "outbox.postgres.pool",
        "migrate": "outbox.postgres.schema",
        "migrations_sql": "outbox.postgres.schema",
        "pending": "outbox.postgres.schema",
    },
)
