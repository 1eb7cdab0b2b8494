"""Adding messages through a connection the application already holds, in its transaction.

``add`` (psycopg ``AsyncConnection``) and ``add_sync`` (psycopg
``Connection``) need no pool and no store: the message is one more row in the
caller's own transaction, committed or rolled back with the change it
announces. A connection outside any transaction is refused with
NotInTransaction (the row would commit on its own), and nothing is stored.
Many messages are one statement.

Relays wake at once when told after the commit: ``wake(conn)`` (or the
``transaction(conn)`` context manager, which calls it) sends one notification
for the topics ``add`` put in through ``conn``, at most once a window per
topic in this process; without it, relays find the messages at their next
poll.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, LiteralString

from outbox.errors import NotInTransaction
from outbox.message import Message, check_message
from outbox.postgres.queries import QUERIES
from outbox.wake import CHANNEL, WAKES

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "INSERT_FULL",
    "INSERT_MANY",
    "add",
    "add_sync",
    "checked",
    "insert_params",
    "named_to",
    "transaction",
    "transaction_sync",
    "wake",
    "wake_sync",
]

INSERT_ONE = QUERIES["message_insert"]
INSERT_MANY = QUERIES["message_insert_many"]
INSERT_FULL = QUERIES["message_insert_full"]
INSERT_FULL_ONE = QUERIES["message_insert_full_one"]
NOTIFY = QUERIES["wake_notify"]

_PENDING: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""Topics added through each connection and not yet announced."""


def insert_params(msgs: Sequence[Message], *, text_ids: bool = False) -> dict[str, Any]:
    """The parameters of INSERT_MANY for ``msgs``: one array per column.

    ``text_ids`` passes ids as strings, which every driver adapts (psycopg2
    cannot adapt a UUID without a registered adapter).
    """
    params = {
        "ids": [str(m.id) if text_ids else m.id for m in msgs],
        "topics": [m.topic for m in msgs],
        "payloads": [m.payload.decode() for m in msgs],
        "created": [m.created_at for m in msgs],
        "due": [m.deliver_at or m.created_at for m in msgs],
    }
    if any(m.key is not None or m.headers for m in msgs):
        # INSERT_FULL's; messages without keys or headers stay as they were
        params["keys"] = [m.key for m in msgs]
        params["headers"] = [_headers(m) for m in msgs]
    return params


def _headers(m: Message) -> str | None:
    return json.dumps(dict(m.headers), separators=(",", ":")) if m.headers else None


def insert(msgs: Sequence[Message]) -> tuple[LiteralString, dict[str, Any]]:
    """The statement and parameters that add ``msgs`` (psycopg's placeholders)."""
    if len(msgs) == 1:
        m = msgs[0]
        if m.key is None and not m.headers:
            return INSERT_ONE, _one(m)
        return INSERT_FULL_ONE, {**_one(m), "key": m.key, "headers": _headers(m)}
    params = insert_params(msgs)
    return (INSERT_FULL if "keys" in params else INSERT_MANY), params


def _one(m: Message) -> dict[str, Any]:
    return {
        "id": m.id,
        "topic": m.topic,
        "payload": m.payload.decode(),
        "created_at": m.created_at,
        "deliver_at": m.deliver_at,
    }


_IDLE = 0
"""libpq's PQTRANS_IDLE (psycopg.pq.TransactionStatus.IDLE): read from the
connection's PGconn, an int, where ``conn.info.transaction_status`` builds an
info object and an enum member on every call of every add."""


def _idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return bool(conn.pgconn.transaction_status == _IDLE)


def _in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    if _idle(conn):
        raise NotInTransaction("the psycopg connection")


def checked(msgs: Sequence[Message]) -> Sequence[Message]:
    """``msgs``, each as new_message would make it (a valid topic, strict JSON), or ValueError.

    Every producer API checks, so a message built by hand cannot slip a bad
    topic or a payload that loses data into the table.
    """
    for m in msgs:
        check_message(m)
    return msgs


async def add(conn: psycopg.AsyncConnection[Any], /, *msgs: Message) -> None:
    """Insert ``msgs`` through ``conn``, inside the caller's open transaction."""
    checked(msgs)
    _in_transaction(conn)
    if msgs:
        await conn.execute(*insert(msgs))
    _PENDING.setdefault(conn, set()).update(m.topic for m in msgs)


def add_sync(conn: psycopg.Connection[Any], /, *msgs: Message) -> None:
    """Insert ``msgs`` through ``conn``, inside the caller's open transaction."""
    checked(msgs)
    _in_transaction(conn)
    if msgs:
        conn.execute(*insert(msgs))
    _PENDING.setdefault(conn, set()).update(m.topic for m in msgs)


async def wake(conn: psycopg.AsyncConnection[Any]) -> bool:
    """After the commit: wake the relays for what ``add`` put in through ``conn``.

    Does nothing inside a transaction (a notification must not ride in one)
    and never raises: relays poll anyway. True if a notification went out.
    """
    if not _idle(conn):
        return False
    topics = _PENDING.pop(conn, None)
    if not topics:
        return False

    async def notify(payload: str) -> None:
        if conn.autocommit:
            await conn.execute(NOTIFY, {"channel": CHANNEL, "payload": payload})
            return
        # One statement on its own: in autocommit for it, one round trip
        # instead of a BEGIN, the statement and a COMMIT (the switch is the
        # driver's, sent to nobody).
        await conn.set_autocommit(True)
        try:
            await conn.execute(NOTIFY, {"channel": CHANNEL, "payload": payload})
        finally:
            if _idle(conn):
                await conn.set_autocommit(False)

    return await WAKES.send_async(topics, notify)


def wake_sync(conn: psycopg.Connection[Any]) -> bool:
    """wake(), for a psycopg ``Connection``."""
    if not _idle(conn):
        return False
    topics = _PENDING.pop(conn, None)
    if not topics:
        return False

    def notify(payload: str) -> None:
        if conn.autocommit:
            conn.execute(NOTIFY, {"channel": CHANNEL, "payload": payload})
            return
        conn.autocommit = True  # as in wake()
        try:
            conn.execute(NOTIFY, {"channel": CHANNEL, "payload": payload})
        finally:
            if _idle(conn):
                conn.autocommit = False

    return WAKES.send(topics, notify)


def forget(conn: object) -> None:
    """Drop what ``conn`` added without announcing it (its transaction rolled back)."""
    _PENDING.pop(conn, None)


@asynccontextmanager
async def transaction(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """``conn.transaction()``, then, once it committed, wake(conn)."""
    try:
        async with conn.transaction():
            yield conn
    except BaseException:
        forget(conn)
        raise
    await wake(conn)


@contextmanager
def transaction_sync(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """transaction(), for a psycopg ``Connection``."""
    try:
        with conn.transaction():
            yield conn
    except BaseException:
        forget(conn)
        raise
    wake_sync(conn)


_NAMED = re.compile(r"%\((\w+)\)s")


def named_to(style: str, sql: LiteralString = INSERT_MANY) -> tuple[str, list[str]]:
    """``sql`` with its %(name)s parameters as ``:name`` (colon) or ``%s`` (format).

    Returns the statement and the parameter names in the order they appear.
    """
    names = _NAMED.findall(sql)
    if style == "colon":
        return _NAMED.sub(r":\1", sql), names
    return _NAMED.sub("%s", sql), names
