"""A relay's ear: LISTEN for wake-ups on a connection of its own."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
from psycopg import sql

from outbox.postgres.connection import connect
from outbox.postgres.queries import QUERIES
from outbox.wake import CHANNEL, decode_topics

__all__ = ["PROBE", "listen"]

PROBE = "_probe."
"""A listener's own probe: no topic starts with "_", so no relay claims for it."""

log = logging.getLogger("outbox.relay")


PROBE_WAIT = 1.0
"""How long the listener waits for its own probe notification after LISTEN."""
_OFF = (
    "wake-ups are off: a notification this relay sent itself never reached its "
    "listener (a transaction pooler, like PgBouncer with pool_mode=transaction, "
    "between the relay and PostgreSQL?); set OUTBOX_LISTEN_URL to a direct or "
    "session-mode URL. Polling delivers meanwhile"
)


async def listen(
    url: str,
    wake: Callable[[frozenset[str] | None], None],
    *,
    retry: float = 1.0,
    connect_timeout: int = 5,
    probe_wait: float = PROBE_WAIT,
) -> None:
    """Call ``wake(topics)`` for every notification on the outbox channel, until cancelled.

    A dropped connection is made again after ``retry`` seconds, and ``wake(None)``
    follows every (re)connection: something may have been committed while
    nobody listened. Meanwhile polling delivers; nothing depends on this. After
    each LISTEN a probe is sent from a second connection: when it has not
    arrived within ``probe_wait`` (LISTEN went through a transaction pooler to
    a server session this client no longer holds), the listener says so once
    and stops listening.
    """
    down = False
    while True:
        try:
            conn = await _connect(url, connect_timeout)
            try:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                if not await _heard(conn, url, probe_wait, connect_timeout):
                    log.warning(_OFF)
                    await anyio.sleep_forever()
                if down:
                    log.info("listening for wake-ups again")
                down = False
                wake(None)
                async for note in conn.notifies():
                    if not note.payload.startswith(PROBE):
                        wake(decode_topics(note.payload))
            finally:
                await _close(conn)
        except (psycopg.Error, TimeoutError) as exc:
            if not down:
                log.warning("wake-ups lost (%s); polling until they are back", exc)
            down = True
        await anyio.sleep(retry)


async def _connect(url: str, seconds: int) -> psycopg.AsyncConnection[Any]:
    """A connection, made to the end even when the relay stops meanwhile (within
    ``seconds``): cancelled in its last steps, psycopg's connect would leave an
    open connection behind for the garbage collector."""
    with anyio.fail_after(seconds + 1, shield=True):
        return await connect(url, autocommit=True, connect_timeout=seconds, prepare_threshold=None)


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    # Shielded: a stopping relay's cancellation would interrupt close() itself.
    with anyio.CancelScope(shield=True):
        await conn.close()


async def _heard(
    conn: psycopg.AsyncConnection[Any], url: str, wait: float, connect_timeout: int
) -> bool:
    """Whether a notification sent from another connection reaches ``conn``, as a
    producer's would (behind a transaction pooler it never does)."""
    token = f"{PROBE}{secrets.token_hex(8)}"
    other = await _connect(url, connect_timeout)
    try:
        await other.execute(QUERIES["wake_notify"], {"channel": CHANNEL, "payload": token})
    finally:
        await _close(other)
    async for note in conn.notifies(timeout=wait):
        if note.payload == token:
            return True
    return False
