"""The relay's pool hands out the connection returned last (outbox.postgres.pool)."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

from outbox.postgres import connect_pool

pytestmark = pytest.mark.anyio


async def _pid(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_the_connection_returned_last_is_handed_out_first(pg_conninfo: str) -> None:
    async with connect_pool(pg_conninfo, min_size=3, max_size=3) as pool:
        await pool.wait(timeout=10)
        taken = [await pool.getconn() for _ in range(3)]
        pids = [await _pid(conn) for conn in taken]
        assert len(set(pids)) == 3
        for conn in taken:  # returned in order: the third is the last
            await pool.putconn(conn)
        for _ in range(5):  # one statement after another: always the same process
            async with pool.connection() as conn:
                assert await _pid(conn) == pids[2]
        # Two at once: the two used last; the one idle longest stays idle.
        async with pool.connection() as a, pool.connection() as b:
            assert {await _pid(a), await _pid(b)} == {pids[2], pids[1]}


async def test_the_pool_still_hands_out_every_connection_under_load(pg_conninfo: str) -> None:
    async with connect_pool(pg_conninfo, min_size=3, max_size=3) as pool:
        await pool.wait(timeout=10)
        seen: set[int] = set()
        all_held = anyio.Event()

        async def hold() -> None:
            async with pool.connection() as conn:
                seen.add(await _pid(conn))
                if len(seen) == 3:
                    all_held.set()
                await all_held.wait()  # each keeps its own until all three hold one

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(hold)
        assert len(seen) == 3
