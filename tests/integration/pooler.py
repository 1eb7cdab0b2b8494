"""A real PgBouncer in transaction mode in front of the test PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.tools import require
from tools import pgbouncer as bouncer
from tools.pgbouncer import warm

__all__ = ["pgbouncer", "warm"]


@contextmanager
def pgbouncer(postgres_url: str, *, pool_mode: str = "transaction") -> Iterator[str]:
    """tools.pgbouncer.pgbouncer, skipped (or failed on CI) without PgBouncer installed."""
    with bouncer.pgbouncer(
        postgres_url, require("pgbouncer", "pgbouncer"), pool_mode=pool_mode
    ) as url:
        yield url
