"""Add messages through SQLAlchemy, in the session's (or connection's) own transaction.

Any PostgreSQL driver SQLAlchemy drives works (psycopg, psycopg2, asyncpg):
the insert goes through SQLAlchemy itself, one statement for any number of
messages. A session or connection outside a transaction, or one on a driver
level autocommit, is refused with NotInTransaction and nothing is stored.
Once a Session commits, relays are woken for what it added. Needs the
``sqlalchemy`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from outbox.errors import NotInTransaction
from outbox.message import Message
from outbox.postgres.producer import INSERT_FULL, checked, insert_params, named_to
from outbox.wake import CHANNEL, WAKES

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["add", "add_async"]

_SQL, _ = named_to("colon")
_SQL_FULL, _ = named_to("colon", INSERT_FULL)


def _statement(params: dict[str, object]) -> str:
    return _SQL_FULL if "keys" in params else _SQL


def add(bind: Session | Connection, /, *msgs: Message) -> None:
    """Insert ``msgs`` in the transaction ``bind`` (a Session or a Connection) has open."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    checked(msgs)
    if isinstance(bind, Session):
        if not bind.in_transaction():
            raise NotInTransaction("the SQLAlchemy session")
        conn = bind.connection()
    else:
        conn = bind
    _check(conn.in_transaction(), conn.connection.dbapi_connection, "the SQLAlchemy connection")
    if msgs:
        params = insert_params(msgs, text_ids=True)
        conn.execute(text(_statement(params)), params)
        if isinstance(bind, Session):
            _wake_after_commit(bind, msgs)


async def add_async(bind: AsyncSession | AsyncConnection, /, *msgs: Message) -> None:
    """Insert ``msgs`` in the transaction ``bind`` (an AsyncSession or AsyncConnection) has open."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession

    checked(msgs)
    if isinstance(bind, AsyncSession):
        if not bind.in_transaction():
            raise NotInTransaction("the SQLAlchemy session")
        conn = await bind.connection()
    else:
        conn = bind
    raw = await conn.get_raw_connection()
    _check(conn.in_transaction(), raw.dbapi_connection, "the SQLAlchemy connection")
    if msgs:
        params = insert_params(msgs, text_ids=True)
        await conn.execute(text(_statement(params)), params)
        if isinstance(bind, AsyncSession):
            _wake_after_commit(bind.sync_session, msgs)


_TOPICS = "outbox.topics"
_HOOKED = "outbox.hooked"


def _wake_after_commit(session: Session, msgs: Sequence[Message]) -> None:
    """Note the topics; once the session commits, wake the relays for them.

    Only a Session has an after-commit hook; messages added through a bare
    Connection are found at the relays' next poll.
    """
    from sqlalchemy import event

    session.info.setdefault(_TOPICS, set()).update(m.topic for m in msgs)
    if not session.info.get(_HOOKED):
        session.info[_HOOKED] = True
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_rollback", _after_rollback)


def _after_commit(session: Session) -> None:
    from sqlalchemy import Engine, text

    topics = session.info.pop(_TOPICS, None)
    if not topics:
        return
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine

    def notify(payload: str) -> None:
        # The session cannot run SQL here; a connection of the same engine can,
        # in autocommit: one round trip, no BEGIN and COMMIT around it.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(_NOTIFY), {"channel": CHANNEL, "payload": payload})

    WAKES.send(topics, notify)


def _after_rollback(session: Session) -> None:
    session.info.pop(_TOPICS, None)


_NOTIFY = "SELECT pg_notify(:channel, :payload)"


def _check(in_transaction: bool, dbapi: Any, where: str) -> None:
    # SQLAlchemy "begins" on a driver-level autocommit connection too (the
    # AUTOCOMMIT isolation level); only the driver knows its statements then
    # commit one by one.
    if not in_transaction or getattr(dbapi, "autocommit", False):
        raise NotInTransaction(where)
