"""The relay's connection pool: autocommit, nothing prepared, dead peers detected."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

__all__ = ["KEEPALIVES", "connect_pool", "keepalives"]


def connect_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 4,
    prepare: bool = False,
    **kwargs: Any,
) -> psycopg_pool.AsyncConnectionPool:
    """An unopened pool whose connections suit the store (autocommit, dead-peer detection).

    In autocommit each relay statement is one round trip; ``begin()`` still
    opens a real transaction. Open it with ``async with connect_pool(...) as pool``.
    No statement is prepared on the server unless ``prepare`` says so: behind a
    transaction pooler every client names its prepared statements alike, and
    the next transaction may run on a server connection that has another's.
    """
    return psycopg_pool.AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={
            "autocommit": True,
            "prepare_threshold": 5 if prepare else None,
            **keepalives(conninfo),
        },
        open=False,
        **kwargs,
    )


KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
"""libpq's dead-peer detection: a server that vanishes without a reset (a network
partition, a failed-over host) is given up on within about 10 s instead of after
TCP's retransmission backoff (minutes), so a relay resumes soon after the heal."""


def keepalives(conninfo: str) -> dict[str, str]:
    """KEEPALIVES less what ``conninfo`` sets itself (its own values win)."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}  # the connection attempt says what is wrong with it
    return {k: v for k, v in KEEPALIVES.items() if k not in given}
