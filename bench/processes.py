"""Two relay processes against one, beside the reference relay's and pgqueuer's.

Each run pre-fills N no-op messages (COPY, then VACUUM ANALYZE) into a fresh
schema; P processes each run ``Relay.run()`` (batch 100, the default
concurrency and interval) from the moment all are connected until they have
delivered every message (each counts in shared memory, so the harness costs
the database nothing) and the last ack is committed. The reference relay
(bench/reference.py) drains its own table with --workers 1
and 2, and pgqueuer 1.6 (a bench-only dependency: ``pip install -e
'.[bench]'``) the same N jobs with one and two worker processes at batch 100.
Prints messages per second and each system's two/one ratio per round.

    python -m bench processes [--database-url URL] [--messages N] [--rounds R]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
from prometheus_client import CollectorRegistry

from bench.pipeline import reference
from bench.server import arguments, postgres
from bench.throughput import drop_schema, fresh_schema, prefill, schema_conninfo
from outbox import Message, Relay, RelayConfig
from outbox.postgres import PostgresStore, connect_pool


async def _relay(
    go: Any, stop: Any, ready: Any, count: Any, conninfo: str, config: dict[str, Any]
) -> None:
    async def noop(m: Message) -> None:
        count.value += 1  # this process's own counter: no lock, no query

    async with connect_pool(conninfo, min_size=2, max_size=4) as pool:
        await pool.wait()
        # The default interval (1 s): housekeeping (registry, heartbeat) at its production pace.
        cfg = RelayConfig.model_validate({"batch": 100, **config})
        relay = Relay(PostgresStore(pool), {"bench.noop": noop}, cfg, registry=CollectorRegistry())
        ready.put(os.getpid())
        await anyio.to_thread.run_sync(go.wait)
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await anyio.to_thread.run_sync(stop.wait)
            relay.stop()


def outbox_process(
    go: Any, stop: Any, ready: Any, count: Any, conninfo: str, config: dict[str, Any]
) -> None:
    anyio.run(_relay, go, stop, ready, count, conninfo, config)


def race(
    target: Callable[..., None],
    args: tuple[Any, ...],
    n: int,
    processes: int,
    done: Callable[[], None] = lambda: None,
) -> float:
    """Seconds from releasing ``processes`` connected ``target`` processes until
    they delivered ``n`` messages and ``done()`` returned; then they are stopped.

    Each process gets (go, stop, ready, count) before ``args`` and counts its
    deliveries in shared memory, so the harness costs the database nothing.
    """
    ctx = mp.get_context("spawn")
    go, stop, ready = ctx.Event(), ctx.Event(), ctx.Queue()
    counts = [ctx.RawValue("q", 0) for _ in range(processes)]
    procs = [ctx.Process(target=target, args=(go, stop, ready, c, *args)) for c in counts]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    started = time.perf_counter()
    go.set()
    while sum(c.value for c in counts) < n:
        time.sleep(0.001)
    done()
    elapsed = time.perf_counter() - started
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():  # pgqueuer has no stop to ask for
            p.kill()
            p.join()
    return elapsed


def ours(url: str, n: int, processes: int, config: dict[str, Any]) -> float:
    schema = fresh_schema(url)
    conninfo = schema_conninfo(url, schema)

    def acked() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_messages)").fetchone()[0]:
                time.sleep(0.001)

    try:
        prefill(conninfo, n)
        return n / race(outbox_process, (conninfo, config), n, processes, acked)
    finally:
        drop_schema(url, schema)


async def _pgqueuer(conninfo: str, go: Any, ready: Any, count: Any) -> None:
    from pgqueuer import Job, PgQueuer, PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    pgq = PgQueuer(PsycopgDriver(conn))

    @pgq.entrypoint("bench.noop")
    async def noop(job: Job) -> None:
        count.value += 1

    ready.put(os.getpid())
    await anyio.to_thread.run_sync(go.wait)
    await pgq.run(batch_size=100)


def pgqueuer_process(go: Any, stop: Any, ready: Any, count: Any, conninfo: str) -> None:
    import asyncio

    asyncio.run(_pgqueuer(conninfo, go, ready, count))


def pgqueuer(url: str, n: int, processes: int) -> float:
    """pgqueuer 1.6 (a bench-only dependency) at batch 100: N jobs, P worker processes."""
    from pgqueuer import PsycopgDriver, Queries

    schema = fresh_schema(url)
    conninfo = schema_conninfo(url, schema)

    async def fill() -> None:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for start in range(0, n, 5000):
            k = min(5000, n - start)
            await queries.enqueue(["bench.noop"] * k, [b'{"to": "x@example.com"}'] * k, [0] * k)
        await conn.execute("VACUUM ANALYZE")
        await conn.close()

    try:
        anyio.run(fill)
        return n / race(pgqueuer_process, (conninfo,), n, processes)
    finally:
        drop_schema(url, schema)


def main() -> int:
    parser = arguments(__doc__, rounds=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, help="OUTBOX_CONCURRENCY (default: 8 batches)")
    parser.add_argument("--no-pgqueuer", action="store_true", help="leave pgqueuer 1.6 out")
    args = parser.parse_args()
    config = {} if args.concurrency is None else {"concurrency": args.concurrency}
    with postgres(args.database_url) as url:
        print(f"{args.messages} messages, no-op handler, batch 100")
        for r in range(args.rounds):
            one, two = ours(url, args.messages, 1, config), ours(url, args.messages, 2, config)
            ref1, ref2 = reference(url, args.messages, 1), reference(url, args.messages, 2)
            print(
                f"round {r + 1}: relay 1 process {one:,.0f}/s, 2 processes {two:,.0f}/s"
                f" ({two / one:.2f}x); reference 1 worker {ref1:,.0f}/s, 2 workers"
                f" {ref2:,.0f}/s ({ref2 / ref1:.2f}x); relay/reference {one / ref1:.2f}"
                f" and {two / ref2:.2f}",
                flush=True,
            )
            if not args.no_pgqueuer:
                pq1, pq2 = pgqueuer(url, args.messages, 1), pgqueuer(url, args.messages, 2)
                print(
                    f"         pgqueuer 1.6 1 process {pq1:,.0f}/s, 2 processes {pq2:,.0f}/s"
                    f" ({pq2 / pq1:.2f}x); relay/pgqueuer {one / pq1:.2f} and {two / pq2:.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
