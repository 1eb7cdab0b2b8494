"""A table that stays small: a sustained load, then backlogs of two sizes.

Sustained: for --minutes, a producer adds --rate messages per second (a
transaction of ``add_sync`` every 100 ms) while --relays relay processes (``Relay.run()``, no-op
handler, batch 10, OUTBOX_CONCURRENCY 40, interval 100 ms) deliver them. Every
--every seconds it prints the table's and its indexes' size, live and dead
rows, autovacuum runs and the backlog. Run once with the shipped storage
parameters and, with --defaults too, once more with PostgreSQL's defaults
(the parameters reset), side by side.

Backlog: one relay process drains 20,000 and then 100,000 messages at batch
100; messages per second for each (the larger must not be slower per message).

    python -m bench table [--database-url URL] [--minutes 10] [--defaults]

Autovacuum must be on in the server (it is in the embedded PostgreSQL that
runs without --database-url).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
from typing import Any

import anyio
import psycopg
from prometheus_client import CollectorRegistry

from bench.server import arguments, postgres
from bench.throughput import drain_rate, drop_schema, fresh_schema, schema_conninfo
from outbox import Message, Relay, RelayConfig, new_message
from outbox.postgres import PostgresStore, add_sync, connect_pool, transaction_sync

STORAGE = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
)
SIZES = """
SELECT pg_relation_size('outbox_messages'), pg_indexes_size('outbox_messages'),
       n_live_tup, n_dead_tup, autovacuum_count, n_tup_upd, n_tup_hot_upd,
       (SELECT count(*) FROM outbox_messages)
FROM pg_stat_user_tables WHERE relid = 'outbox_messages'::regclass
"""
SIZES_BY_INDEX = """
SELECT indexrelid::regclass::text, pg_relation_size(indexrelid)
FROM pg_index WHERE indrelid = 'outbox_messages'::regclass ORDER BY 1
"""


async def _relay(conninfo: str, stop: Any) -> None:
    async def noop(m: Message) -> None:
        return None

    async with connect_pool(conninfo, min_size=2, max_size=4) as pool:
        cfg = RelayConfig.model_validate({"batch": 10, "interval": "100ms"})
        relay = Relay(PostgresStore(pool), {"bench.noop": noop}, cfg, registry=CollectorRegistry())
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await anyio.to_thread.run_sync(stop.wait)
            relay.stop()


def relay_process(conninfo: str, stop: Any) -> None:
    anyio.run(_relay, conninfo, stop)


def produce(conninfo: str, rate: int, until: float, added: list[int]) -> None:
    """Add ``rate`` messages a second through the product's own API, a batch every 100 ms."""
    per_tick = max(rate // 10, 1)
    payload = {"to": "x@example.com"}
    with psycopg.connect(conninfo) as conn:
        tick = time.monotonic()
        while tick < until:
            with transaction_sync(conn):
                add_sync(conn, *(new_message("bench.noop", payload) for _ in range(per_tick)))
            added[0] += per_tick
            tick += 0.1
            time.sleep(max(tick - time.monotonic(), 0))


def sustained(
    url: str, *, defaults: bool, minutes: float, rate: int, relays: int, every: float
) -> None:
    schema = fresh_schema(url)
    conninfo = schema_conninfo(url, schema)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            if defaults:
                conn.execute(f"ALTER TABLE outbox_messages RESET ({', '.join(STORAGE)})")
            options = conn.execute(
                "SELECT reloptions FROM pg_class WHERE oid = 'outbox_messages'::regclass"
            ).fetchone()
            print(f"storage: {(options or [None])[0] or 'PostgreSQL defaults'}", flush=True)
            ctx = mp.get_context("spawn")
            stop = ctx.Event()
            procs = [
                ctx.Process(target=relay_process, args=(conninfo, stop)) for _ in range(relays)
            ]
            for p in procs:
                p.start()
            started = time.monotonic()
            added = [0]
            producer = threading.Thread(
                target=produce, args=(conninfo, rate, started + minutes * 60, added)
            )
            producer.start()
            print(
                " minute  table MB  indexes MB    live    dead  autovacuums  HOT/updates  backlog"
            )
            while producer.is_alive():
                producer.join(every)
                heap, indexes, live, dead, vacuums, upd, hot, backlog = conn.execute(
                    SIZES
                ).fetchone()
                minute = (time.monotonic() - started) / 60
                print(
                    f"{minute:7.1f}  {heap / 2**20:8.2f}  {indexes / 2**20:10.2f}  {live:6}"
                    f"  {dead:6}  {vacuums:11}  {hot:5}/{upd:<7}  {backlog:7}",
                    flush=True,
                )
            stop.set()
            for p in procs:
                p.join()
            for name, size in conn.execute(SIZES_BY_INDEX):
                print(f"  {name}: {size / 2**20:.2f} MB", flush=True)
            elapsed = time.monotonic() - started
            print(
                f"added {added[0]:,} in {elapsed:.0f} s ({added[0] / elapsed:,.0f}/s)", flush=True
            )
    finally:
        drop_schema(url, schema)


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--relays", type=int, default=3)
    parser.add_argument("--every", type=float, default=30)
    parser.add_argument("--defaults", action="store_true")
    parser.add_argument("--skip-sustained", action="store_true")
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT current_setting('autovacuum'), version()").fetchone()
            print(f"autovacuum {row[0]}; {row[1].split(',')[0]}")
        if not args.skip_sustained:
            runs = (False, True) if args.defaults else (False,)
            for defaults in runs:
                print(f"\n{args.rate}/s for {args.minutes:g} min, {args.relays} relays", flush=True)
                sustained(
                    url,
                    defaults=defaults,
                    minutes=args.minutes,
                    rate=args.rate,
                    relays=args.relays,
                    every=args.every,
                )
        print("\nbacklog drain, one relay, batch 100", flush=True)
        for n in (20_000, 100_000, 20_000, 100_000):
            print(f"{n:>7,}: {drain_rate(url, n, 100, 1):,.0f} msg/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
