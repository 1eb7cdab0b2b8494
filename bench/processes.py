"""Two relay processes against one, beside the reference relay's one and two workers.

Each run pre-fills N no-op messages (COPY, then VACUUM ANALYZE) into a fresh
schema; P processes each run ``Relay.run()`` (batch 100, the default
concurrency and interval) from the moment all are connected until they have
delivered every message (each counts in shared memory, so the harness costs
the database nothing) and the last ack is committed. The reference relay
(../shared/bench/reference_relay.py) drains its own table with --workers 1
and 2. Prints messages per second and each system's two/one ratio per round.

    python bench/processes.py [--database-url URL] [--messages N] [--rounds R]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any

import anyio
import psycopg
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig
from outbox.postgres import PostgresStore, connect_pool
from pipeline import REFERENCE
from server import postgres
from throughput import drop_schema, fresh_schema, prefill, schema_conninfo


async def _relay(
    conninfo: str, go: Any, stop: Any, ready: Any, config: dict[str, Any], count: Any
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


def relay_process(
    conninfo: str, go: Any, stop: Any, ready: Any, config: dict[str, Any], count: Any
) -> None:
    anyio.run(_relay, conninfo, go, stop, ready, config, count)


def ours(url: str, n: int, processes: int, config: dict[str, Any]) -> float:
    schema = fresh_schema(url)
    conninfo = schema_conninfo(url, schema)
    try:
        prefill(conninfo, n)
        ctx = mp.get_context("spawn")
        go, stop, ready = ctx.Event(), ctx.Event(), ctx.Queue()
        counts = [ctx.RawValue("q", 0) for _ in range(processes)]
        procs = [
            ctx.Process(target=relay_process, args=(conninfo, go, stop, ready, config, count))
            for count in counts
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get()
        started = time.perf_counter()
        go.set()
        # Delivered counts, not a query: polling the table would cost the database.
        while sum(c.value for c in counts) < n:
            time.sleep(0.001)
        with psycopg.connect(conninfo, autocommit=True) as conn:  # and the last acks
            while conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_messages)").fetchone()[0]:
                time.sleep(0.001)
        elapsed = time.perf_counter() - started
        stop.set()
        for p in procs:
            p.join()
        return n / elapsed
    finally:
        drop_schema(url, schema)


def reference(url: str, n: int, workers: int) -> float:
    result = subprocess.run(
        [
            sys.executable,
            str(REFERENCE),
            "--database-url",
            url,
            "--n",
            str(n),
            "--batch",
            "100",
            "--workers",
            str(workers),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rate: float = json.loads(result.stdout.strip().splitlines()[-1])["drain_msg_s"]
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("OUTBOX_BENCH_DATABASE_URL"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, help="OUTBOX_CONCURRENCY (default: 4 batches)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
