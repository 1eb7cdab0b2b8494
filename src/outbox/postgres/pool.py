"""The relay's connection pool: autocommit, nothing prepared, dead peers detected."""

from __future__ import annotations

from typing import Any

import psycopg_pool

from outbox.postgres.connection import keepalives

__all__ = ["RECONNECT_TIMEOUT", "connect_pool"]


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
    # The pool's own reconnection backs off up to minutes; given up early, the
    # next store call starts a fresh attempt, so the relay's backoff is the one.
    kwargs.setdefault("reconnect_timeout", RECONNECT_TIMEOUT)
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


RECONNECT_TIMEOUT = 5.0
"""How long the pool retries a lost connection in the background (psycopg_pool's default: 5 min)."""
