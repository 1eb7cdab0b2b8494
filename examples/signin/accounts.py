"""The user domain's SQL, run inside the caller's transaction.

Every function takes the psycopg connection of a transaction the use case
opened with ``store.begin()``, so the data change and its outbox message
commit together.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg

from examples.signin.errors import EmailTaken
from outbox.postgres.queries import load_queries

__all__ = [
    "Conn",
    "account_by_email",
    "account_get",
    "account_set_email",
    "account_upsert",
    "email_change_confirm",
    "email_change_insert",
    "login_code_insert",
    "login_code_redeem",
]

Conn = psycopg.AsyncConnection[Any]
_Q = load_queries("examples.signin")


async def _one(conn: Conn, name: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    cur = await conn.execute(_Q[name], params)
    return await cur.fetchone()


async def account_upsert(conn: Conn, email: str, now: dt.datetime) -> tuple[uuid.UUID, str]:
    row = await _one(conn, "account_upsert", {"id": uuid.uuid4(), "email": email, "now": now})
    assert row is not None
    return row[0], row[1]


async def account_get(conn: Conn, account_id: uuid.UUID) -> tuple[uuid.UUID, str] | None:
    row = await _one(conn, "account_get", {"id": account_id})
    return None if row is None else (row[0], row[1])


async def account_by_email(conn: Conn, email: str) -> tuple[uuid.UUID, str] | None:
    row = await _one(conn, "account_by_email", {"email": email})
    return None if row is None else (row[0], row[1])


async def account_set_email(conn: Conn, account_id: uuid.UUID, email: str) -> None:
    try:
        async with conn.transaction():  # a savepoint: the caller's transaction survives
            await conn.execute(_Q["account_set_email"], {"id": account_id, "email": email})
    except psycopg.errors.UniqueViolation:
        raise EmailTaken("outbox: another account has this email address") from None


async def login_code_insert(
    conn: Conn, account_id: uuid.UUID, code_hash: bytes, expires_at: dt.datetime, now: dt.datetime
) -> None:
    await conn.execute(
        _Q["login_code_insert"],
        {
            "id": uuid.uuid4(),
            "account_id": account_id,
            "code_hash": code_hash,
            "expires_at": expires_at,
            "now": now,
        },
    )


async def login_code_redeem(
    conn: Conn, account_id: uuid.UUID, code_hash: bytes, now: dt.datetime
) -> bool:
    params = {"account_id": account_id, "code_hash": code_hash, "now": now}
    return await _one(conn, "login_code_redeem", params) is not None


async def email_change_insert(
    conn: Conn,
    account_id: uuid.UUID,
    new_email: str,
    token_hash: bytes,
    expires_at: dt.datetime,
    now: dt.datetime,
) -> None:
    await conn.execute(
        _Q["email_change_insert"],
        {
            "id": uuid.uuid4(),
            "account_id": account_id,
            "new_email": new_email,
            "token_hash": token_hash,
            "expires_at": expires_at,
            "now": now,
        },
    )


async def email_change_confirm(
    conn: Conn, token_hash: bytes, now: dt.datetime
) -> tuple[uuid.UUID, str] | None:
    row = await _one(conn, "email_change_confirm", {"token_hash": token_hash, "now": now})
    return None if row is None else (row[0], row[1])
