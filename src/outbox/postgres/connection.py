"""Connections with dead-peer detection: libpq keepalives and a TCP user timeout."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["KEEPALIVES", "connect", "keepalives"]


KEEPALIVES = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
"""libpq's dead-peer detection: a server that vanishes without a reset (a network
partition, a failed-over host) is given up on within about 10 s instead of after
TCP's retransmission backoff (minutes), so a relay resumes soon after the heal;
a connection attempt gives up after 5 s (each host of a multi-host URL)."""


def keepalives(conninfo: str) -> dict[str, str]:
    """KEEPALIVES less what ``conninfo`` sets itself (its own values win)."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}  # the connection attempt says what is wrong with it
    return {k: v for k, v in KEEPALIVES.items() if k not in given}


async def connect(conninfo: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """One connection outside a pool (migrate, checks, the listener), with the same
    dead-peer detection; ``kwargs`` and the URL's own values win."""
    return await psycopg.AsyncConnection.connect(conninfo, **{**keepalives(conninfo), **kwargs})
