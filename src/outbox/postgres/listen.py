"""A relay's ear: LISTEN for wake-ups on a connection of its own."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox.postgres.pool import keepalives
from outbox.wake import CHANNEL, decode_topics

__all__ = ["listen"]

log = logging.getLogger("outbox.relay")


async def listen(
    url: str,
    wake: Callable[[frozenset[str] | None], None],
    *,
    retry: float = 1.0,
    connect_timeout: int = 5,
) -> None:
    """Call ``wake(topics)`` for every notification on the outbox channel, until cancelled.

    A dropped connection is made again after ``retry`` seconds, and ``wake(None)``
    follows every (re)connection: something may have been committed while
    nobody listened. Meanwhile polling delivers; nothing depends on this.
    """
    down = False
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                make_conninfo(url, **keepalives(url)),
                autocommit=True,
                connect_timeout=connect_timeout,
            ) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                if down:
                    log.info("listening for wake-ups again")
                down = False
                wake(None)
                async for note in conn.notifies():
                    wake(decode_topics(note.payload))
        except psycopg.Error as exc:
            if not down:
                log.warning("wake-ups lost (%s); polling until they are back", exc)
            down = True
        await anyio.sleep(retry)
