"""Use cases that change user data and announce it by mail, in one transaction.

Each writes its change and adds its outbox message through the same
``store.begin()`` transaction: if either fails, neither happens. Only hashes
of one-time codes and tokens are stored; the plain values travel in the
message payload to the email and nowhere else.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote, urlencode

from examples.signin import accounts as repo
from examples.signin.errors import EmailTaken, InvalidCode, InvalidToken, UnknownAccount
from outbox.handlers.mail.topics import EMAIL_CHANGE, LOGIN_LINK, EmailChange, LoginLink
from outbox.message import Message, new_message
from outbox.postgres import PostgresStore

__all__ = [
    "CHANGE_TTL",
    "LOGIN_TTL",
    "confirm_email_change",
    "redeem_login_code",
    "request_email_change",
    "request_login_link",
]

LOGIN_TTL = dt.timedelta(minutes=15)
CHANGE_TTL = dt.timedelta(hours=24)


def _code_hash(account_id: uuid.UUID, code: str) -> bytes:
    return hashlib.sha256(account_id.bytes + code.encode()).digest()


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@asynccontextmanager
async def _transaction(store: PostgresStore, conn: repo.Conn | None) -> AsyncIterator[repo.Conn]:
    """The caller's transaction when it passes one, else a new one of the store's."""
    if conn is not None:
        yield conn
        return
    async with store.begin() as tx:
        yield tx


def _check_address(email: str) -> str:
    email = email.strip()
    local, at, domain = email.rpartition("@")
    if (
        not at
        or not local
        or "." not in domain
        or any(c.isspace() or c in ',;:<>()[]"\\' for c in email)
        or "@" in local
    ):
        raise ValueError(f"outbox: not an email address: {email!r}")
    return email


async def request_login_link(
    store: PostgresStore,
    email: str,
    *,
    now: dt.datetime,
    link_base: str,
    ttl: dt.timedelta = LOGIN_TTL,
    conn: repo.Conn | None = None,
) -> Message:
    """Store a sign-in code for ``email`` (its account made on first use) and mail it.

    Returns the outbox message, committed with the code. Pass ``conn`` to make
    it part of a transaction of your own.
    """
    email = _check_address(email)
    code = f"{secrets.randbelow(1_000_000):06d}"
    expires_at = now + ttl
    async with _transaction(store, conn) as conn:
        account_id, address = await repo.account_upsert(conn, email, now)
        await repo.login_code_insert(
            conn, account_id, _code_hash(account_id, code), expires_at, now
        )
        query = urlencode({"email": address, "code": code}, quote_via=quote)
        payload = LoginLink(
            account_id=account_id,
            to=address,
            link=f"{link_base.rstrip('/')}/login?{query}",
            code=code,
            expires_at=expires_at,
        )
        message = new_message(LOGIN_LINK, payload, now)
        await store.add(conn, message)
    return message


async def redeem_login_code(
    store: PostgresStore,
    email: str,
    code: str,
    *,
    now: dt.datetime,
    conn: repo.Conn | None = None,
) -> uuid.UUID:
    """Use a sign-in code once; return the account it signs in. Raises InvalidCode."""
    async with _transaction(store, conn) as conn:
        account = await repo.account_by_email(conn, email.strip())
        if account is None or not await repo.login_code_redeem(
            conn, account[0], _code_hash(account[0], code.strip()), now
        ):
            raise InvalidCode("outbox: the sign-in code is wrong, used or expired")
        return account[0]


async def request_email_change(
    store: PostgresStore,
    account_id: uuid.UUID,
    new_email: str,
    *,
    now: dt.datetime,
    link_base: str,
    ttl: dt.timedelta = CHANGE_TTL,
    conn: repo.Conn | None = None,
) -> Message:
    """Store a pending change of the account's email and mail a link to the new address.

    Pass ``conn`` to make it part of a transaction of your own.
    """
    new_email = _check_address(new_email)
    token = secrets.token_urlsafe(32)
    expires_at = now + ttl
    async with _transaction(store, conn) as conn:
        account = await repo.account_get(conn, account_id)
        if account is None:
            raise UnknownAccount(f"outbox: no account {account_id}")
        taken = await repo.account_by_email(conn, new_email)
        if taken is not None and taken[0] != account_id:
            raise EmailTaken("outbox: another account has this email address")
        await repo.email_change_insert(
            conn, account_id, new_email, _token_hash(token), expires_at, now
        )
        payload = EmailChange(
            account_id=account_id,
            to=new_email,
            previous=account[1],
            link=f"{link_base.rstrip('/')}/email/confirm?{urlencode({'token': token})}",
            expires_at=expires_at,
        )
        message = new_message(EMAIL_CHANGE, payload, now)
        await store.add(conn, message)
    return message


async def confirm_email_change(
    store: PostgresStore, token: str, *, now: dt.datetime, conn: repo.Conn | None = None
) -> tuple[uuid.UUID, str]:
    """Apply a pending change once; return (account, new email). Raises InvalidToken."""
    async with _transaction(store, conn) as conn:
        found = await repo.email_change_confirm(conn, _token_hash(token), now)
        if found is None:
            raise InvalidToken("outbox: the confirmation link is wrong, used or expired")
        await repo.account_set_email(conn, *found)
        return found
