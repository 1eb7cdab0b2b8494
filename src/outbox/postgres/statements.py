"""How the PostgreSQL store runs its statements: through the pool, within a deadline,
with driver errors translated, bulk writes in committed batches.

One object that the store and its operator queries (outbox.postgres.operator)
both hold, so each of them reads as the statements it runs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager, suppress
from typing import Any, LiteralString, TypeVar

import anyio
import psycopg
import psycopg.errors
import psycopg_pool

from outbox.errors import NotFound, StoreUnavailable
from outbox.postgres.errors import translate
from outbox.postgres.queries import QUERIES

__all__ = ["DEADLINE", "RERUNS", "Statements"]

DEADLINE = 10.0
"""Longest a store call (each statement of a batched one) may take by default."""

_KEY_UNPARK = QUERIES["key_unpark"]

RERUNS = 3
"""Times a statement that runs on its own is sent when the server rolled it back
for a conflict: a message the ring's rotation moved to the long-stay
partition while a claim or an ack was about to lock it (a serialization
failure), or a claim and an ack of one key's messages waiting for each other
(a deadlock). Rolled back, it did nothing, so it is simply sent again."""

T = TypeVar("T")
Connection = psycopg.AsyncConnection[Any]

_CONFLICTS = frozenset({"40000", "40001", "40P01"})
"""The SQLSTATEs of a rollback for a conflict (psycopg's classes for them do not
share a base). Not 40003, 'statement completion unknown': it may have run."""


def _last(times: int) -> list[bool]:
    """For each of ``times`` attempts, whether it is the last."""
    return [n == times - 1 for n in range(times)]


def _conflict(exc: psycopg.Error) -> bool:
    """Whether the server rolled ``exc``'s statement back for a conflict."""
    return exc.sqlstate in _CONFLICTS


class Statements:
    """Runs the store's statements on ``pool``, each within ``deadline`` seconds.

    A statement the database does not answer in time (a partition, a stalled
    server) fails as StoreUnavailable and its connection is dropped.
    """

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool, deadline: float = DEADLINE):
        self.pool = pool
        self.deadline = deadline

    @asynccontextmanager
    async def bounded(self, seconds: float | None = None) -> AsyncIterator[None]:
        """At most ``seconds`` (the deadline) seconds, or StoreUnavailable."""
        seconds = self.deadline if seconds is None else seconds
        try:
            with anyio.fail_after(seconds):
                yield
        except TimeoutError:
            raise StoreUnavailable(
                f"outbox: database unavailable: no answer within {seconds:g}s"
            ) from None

    @asynccontextmanager
    async def translated(
        self, *, bounded: bool = True, statements: bool = True
    ) -> AsyncIterator[None]:
        """Turn 'cannot reach the database' errors into StoreUnavailable, within
        the deadline unless ``bounded`` is False; with ``statements`` (the store's
        own, not an application's inside begin()), a missing table or column
        into SchemaMissing and any other database error into StoreError.

        A lost connection usually means every idle one in the pool is lost
        too (the server restarted): check them all now, so the next call gets
        a fresh connection instead of failing once per dead one.
        """
        try:
            if bounded:
                async with self.bounded():
                    yield
            else:
                yield
        except psycopg.Error as exc:
            found = translate(exc)
            if isinstance(found, StoreUnavailable):
                with anyio.move_on_after(2):
                    with suppress(psycopg.Error):
                        await self.pool.check()
            elif not statements:
                raise
            raise found from exc

    async def rerun(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """``work`` on a pooled connection (a statement, or a transaction that
        ends with it), done again when the server rolled it back for a
        conflict: up to RERUNS times."""
        async with self.translated():
            for last in _last(RERUNS):
                try:
                    async with self.pool.connection() as conn:
                        return await work(conn)
                except psycopg.Error as exc:
                    if last or not _conflict(exc):
                        raise
        raise AssertionError("unreachable")

    async def fetch(self, query: Any, params: dict[str, Any]) -> list[Any]:
        """The rows of ``query``, a statement of its own (see ``rerun``)."""

        async def rows(conn: Connection) -> list[Any]:
            return await (await conn.execute(query, params)).fetchall()

        return await self.rerun(rows)

    async def count(self, query: Any, params: dict[str, Any]) -> int:
        """How many rows ``query``, a statement of its own, changed (see ``rerun``)."""

        async def changed(conn: Connection) -> int:
            return (await conn.execute(query, params)).rowcount

        return await self.rerun(changed)

    async def change_one(self, query: Any, params: dict[str, Any]) -> None:
        """Run ``query`` on the message ``params["id"]``; NotFound if it changed none."""
        if await self.count(query, params) == 0:
            raise NotFound(params["id"])

    async def unpark(self, gone: Iterable[tuple[str, str | None]]) -> None:
        """Unpark the next message of each key whose head just left (key_unpark)."""
        pairs = _pairs((t, k) for t, k in gone if k is not None)
        if pairs is not None:
            await self.count(_KEY_UNPARK, {"pairs": pairs})

    async def in_batches(
        self, query: LiteralString, params: dict[str, Any], *, unpark: bool = False
    ) -> int:
        """Run ``query`` until it changes fewer than ``limit`` rows, a commit a batch;
        with ``unpark``, each batch's (topic, key) rows go to key_unpark after it."""
        done = 0
        async with self.translated(bounded=False), self.pool.connection() as conn:
            while True:
                async with self.bounded(), conn.transaction():
                    cur = await conn.execute(query, params)
                    gone = await cur.fetchall() if unpark else []
                if gone:
                    await self.unpark(gone)
                done += cur.rowcount
                if cur.rowcount < params["limit"]:
                    return done


def _pairs(keys: Iterable[tuple[str, str]]) -> str | None:
    """key_unpark's parameter: the distinct (topic, key) pairs as a JSON array,
    sorted (concurrent unparks lock rows in one order); None for none."""
    pairs = sorted(set(keys))
    return json.dumps(pairs, separators=(",", ":")) if pairs else None
