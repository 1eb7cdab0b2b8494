"""The relay's connection pool: autocommit, nothing prepared, dead peers detected,
the connection used last handed out first."""

from __future__ import annotations

from collections import deque
from typing import Any

import psycopg_pool

from outbox.postgres.connection import keepalives

__all__ = ["RECONNECT_TIMEOUT", "LastUsedFirst", "connect_pool"]


class LastUsedFirst(psycopg_pool.AsyncConnectionPool):
    """An AsyncConnectionPool that hands out the connection returned last.

    psycopg_pool takes the connection idle longest: a relay's statements
    (a claim, an ack, the next claim) then go round every server process in
    turn, each waking one that slept while the others ran. Taking the one just
    returned keeps the server processes in use few and warm: a key's acks one
    after another, or a claim right after its ack, find the process that ran
    the statement before. The connections idle longest stay at the far end,
    where the pool's shrinking (``max_idle``) closes them.

    The order is psycopg_pool's own deque, turned before each take; a release
    without that method takes as before (tests/integration/test_pool.py).
    """

    async def _get_ready_connection(self, *args: Any, **kwargs: Any) -> Any:
        idle = getattr(self, "_pool", None)
        if isinstance(idle, deque) and len(idle) > 1:
            idle.rotate(1)  # the one returned last, at the end, to the front
        return await super()._get_ready_connection(*args, **kwargs)


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
    return LastUsedFirst(
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
