"""The reference relay: the smallest correct claim/ack loop, the yardstick for drains.

One psycopg 3 async connection in autocommit per worker. A claim leases a
batch (FOR UPDATE SKIP LOCKED, ``leased_until`` a lease ahead); a no-op
handler takes each row in turn; one DELETE ... = ANY acks the batch. No
retries, metrics, routing, keys or fencing: what PostgreSQL lets one Python
process do, so a relay's figure reads as a share of it.

    python -m bench reference [--database-url URL] [--n 50000] [--batch 100] [--workers 1]

Creates its own table (bench_reference), fills it with --n rows (not timed),
starts --workers processes and prints the drain rate (first claim to last
ack) as one JSON line. ``--calibrate FILE`` instead runs this loop and
another reference relay script (same options, same JSON line) alternately,
``--rounds`` times, and prints each ratio.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.server import arguments, postgres

SCHEMA = """
DROP TABLE IF EXISTS bench_reference;
CREATE TABLE bench_reference (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    topic        text        NOT NULL,
    payload      jsonb       NOT NULL,
    due_at       timestamptz NOT NULL DEFAULT now(),
    leased_until timestamptz,
    attempts     int         NOT NULL DEFAULT 0
);
CREATE INDEX bench_reference_due_idx ON bench_reference (due_at);
"""
FILL = """INSERT INTO bench_reference (topic, payload)
SELECT 'orders.created', jsonb_build_object('order', g, 'note', repeat('x', 40))
FROM generate_series(1, %s) AS g"""
CLAIM = """
UPDATE bench_reference SET leased_until = now() + interval '30 seconds', attempts = attempts + 1
WHERE id IN (SELECT id FROM bench_reference
             WHERE due_at <= now() AND (leased_until IS NULL OR leased_until <= now())
             ORDER BY due_at LIMIT %(batch)s
             FOR UPDATE SKIP LOCKED)
RETURNING id, topic, payload, attempts
"""
ACK = "DELETE FROM bench_reference WHERE id = ANY(%s)"


async def handle(row: Any) -> None:
    pass


async def work(url: str, batch: int, start: float) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await asyncio.sleep(max(start - time.time(), 0))  # every worker starts together
        while True:
            rows = await (await conn.execute(CLAIM, {"batch": batch})).fetchall()
            if not rows:
                return
            for row in rows:
                await handle(row)
            await conn.execute(ACK, ([r[0] for r in rows],))


def worker(url: str, batch: int, start: float) -> None:
    asyncio.run(work(url, batch, start))


def drain(url: str, n: int, batch: int, workers: int) -> float:
    """Fill the table with ``n`` rows, drain it with ``workers`` processes; msg/s."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(FILL, (n,))
        conn.execute("VACUUM ANALYZE bench_reference")
    start = time.time() + 1.0
    procs = [mp.Process(target=worker, args=(url, batch, start)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    took = time.time() - start
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_reference")
    return n / took


def calibrate(other: str, url: str, n: int, batch: int, rounds: int) -> None:
    """This loop against ``other`` (a script printing drain_msg_s), alternately."""
    ratios = []
    for r in range(rounds):
        ours = drain(url, n, batch, 1)
        done = subprocess.run(
            [sys.executable, other, "--database-url", url, "--n", str(n), "--batch", str(batch)],
            capture_output=True,
            text=True,
            check=True,
        )
        theirs = float(json.loads(done.stdout.strip().splitlines()[-1])["drain_msg_s"])
        ratios.append(ours / theirs)
        print(
            f"round {r + 1}: this reference {ours:,.0f} msg/s, {other} {theirs:,.0f} msg/s,"
            f" ratio {ours / theirs:.2f}",
            flush=True,
        )
    print(f"median ratio {statistics.median(ratios):.2f}")


def main() -> int:
    parser = arguments(__doc__, rounds=3)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--calibrate", metavar="FILE", help="another reference relay script")
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        if args.calibrate:
            calibrate(args.calibrate, url, args.n, args.batch, args.rounds)
            return 0
        rate = drain(url, args.n, args.batch, args.workers)
    print(json.dumps({"system": "reference", "n": args.n, "batch": args.batch,
                      "workers": args.workers, "drain_msg_s": round(rate, 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
