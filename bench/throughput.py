"""Relay throughput and producer cost against one PostgreSQL.

Pre-fills N messages, drains them with a no-op handler from 1 and 2 relay
processes at batch 10 and 100, and prints messages per second. Then measures
what ``add`` costs a producer transaction compared with a bare insert.

    python -m bench throughput [--database-url URL] [--messages N]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) it starts an embedded
PostgreSQL. Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from typing import Any

import anyio
import psycopg
from prometheus_client import CollectorRegistry
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.server import arguments, postgres
from outbox import Message, Relay, RelayConfig, new_message
from outbox.postgres import PostgresStore, connect_pool, migrate

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def schema_conninfo(url: str, schema: str) -> str:
    return make_conninfo(url, options=f"-c search_path={schema}")


def fresh_schema(url: str) -> str:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    anyio.run(migrate, schema_conninfo(url, schema))
    return schema


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def prefill(conninfo: str, n: int) -> None:
    msgs = [new_message("bench.noop", {"n": i, "to": "x@example.com"}, T0) for i in range(n)]
    with (
        psycopg.connect(conninfo) as conn,
        conn.cursor() as cur,
        cur.copy(
            "COPY outbox_messages (id, topic, payload, created_at, due_at) FROM STDIN"
        ) as copy,
    ):
        for m in msgs:
            copy.write_row((m.id, m.topic, m.payload.decode(), m.created_at, m.created_at))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox_messages")


async def _drain(conninfo: str, batch: int) -> int:
    async def noop(m: Message) -> None:
        return None

    async with connect_pool(conninfo, min_size=1, max_size=2) as pool:
        relay = Relay(
            PostgresStore(pool),
            {"bench.noop": noop},
            RelayConfig.model_validate({"batch": batch}),
            clock=lambda: T0 + dt.timedelta(hours=1),
            registry=CollectorRegistry(),
        )
        await relay.poll()  # warm the pool and the prepared statements
        return await relay.drain()


def relay_process(conninfo: str, batch: int, go: Any, done: Any) -> None:
    go.wait()
    done.put(anyio.run(_drain, conninfo, batch))


def drain_rate(url: str, n: int, batch: int, processes: int) -> float:
    schema = fresh_schema(url)
    try:
        conninfo = schema_conninfo(url, schema)
        prefill(conninfo, n)
        ctx = mp.get_context("spawn")
        go, done = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=relay_process, args=(conninfo, batch, go, done))
            for _ in range(processes)
        ]
        for p in procs:
            p.start()
        time.sleep(1.5)  # let the interpreters import and connect before the clock starts
        started = time.perf_counter()
        go.set()
        handled = sum(done.get() for _ in procs)
        elapsed = time.perf_counter() - started
        for p in procs:
            p.join()
        if handled < n - processes * batch:  # the warm-up polls took a batch each
            raise SystemExit(f"only {handled} of {n} messages were handled")
        return n / elapsed
    finally:
        drop_schema(url, schema)


async def _producer_cost(conninfo: str, rounds: int) -> tuple[float, float]:
    async with connect_pool(conninfo, min_size=1, max_size=1) as pool:
        store = PostgresStore(pool)
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, item text)")

        async def bare() -> None:
            async with store.begin() as conn:
                await conn.execute("INSERT INTO orders (item) VALUES (%s)", ("tea",))

        async def with_message() -> None:
            async with store.begin() as conn:
                await conn.execute("INSERT INTO orders (item) VALUES (%s)", ("tea",))
                await store.add(conn, new_message("orders.placed", {"item": "tea"}, T0))

        results = []
        for fn in (bare, with_message):
            for _ in range(200):
                await fn()
            samples = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(rounds):
                    await fn()
                samples.append((time.perf_counter() - started) / rounds)
            results.append(statistics.median(samples))
        return results[0], results[1]


def producer_cost(url: str, rounds: int) -> tuple[float, float]:
    schema = fresh_schema(url)
    try:
        return anyio.run(_producer_cost, schema_conninfo(url, schema), rounds)
    finally:
        drop_schema(url, schema)


def main() -> int:
    parser = arguments(__doc__, rounds=2_000)
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args()

    with postgres(args.database_url) as url:
        print(f"{args.messages} messages, no-op handler")
        print(f"{'batch':>6} {'processes':>10} {'msg/s':>10}")
        for batch in (10, 100):
            rates = {}
            for processes in (1, 2):
                rates[processes] = drain_rate(url, args.messages, batch, processes)
                print(f"{batch:>6} {processes:>10} {rates[processes]:>10,.0f}", flush=True)
            print(f"{'':>6} {'2 / 1':>10} {rates[2] / rates[1]:>10.2f}")
        bare, with_message = producer_cost(url, args.rounds)
        print(
            f"producer transaction: bare insert {bare * 1e6:.0f} us, "
            f"with add {with_message * 1e6:.0f} us "
            f"(+{(with_message - bare) * 1e6:.0f} us, {with_message / bare:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
