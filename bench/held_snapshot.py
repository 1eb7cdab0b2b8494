"""The outbox while a snapshot is held: latency, backlog and size before, during and after.

Producers add ``--rate`` messages a second in transactions of 10 (each
waking the relays), ``--relays`` `outbox relay` processes (one) at the
defaults deliver them to a handler that notes each arrival (the first, where
a message arrives twice), and the run goes through three phases:
*free* (``--free`` s), *held* (``--hold`` s: a REPEATABLE READ transaction
that read an application table stays open, so no row deleted after it began
can be vacuumed; with ``--dump`` it also reads every outbox table, holding
their ACCESS SHARE locks as pg_dump does) and *after* (``--after`` s).
Every ``--every`` s it samples the outbox's relations (every ``outbox_*``
table, index and TOAST), their dead rows and the pending messages.

Reported per phase, over its second half: commit to handler p50 and p99 and
the rate delivered; at the end of the hold, the production pending (in
seconds) and the size against the free phase's; the slowest producer commit.
With ``--explain N``, instead: N messages added and acked while a snapshot is
held, then the claim under EXPLAIN (ANALYZE, BUFFERS): where a claim's time
goes when what it passes cannot be vacuumed.

Autovacuum must be on (the embedded PostgreSQL, the default, has it on; the
CI machine's PostgreSQL 15 runs with it off).

    python -m bench held_snapshot [--database-url URL] [--rate 1000] [--relays 1]
        [--free 180] [--hold 180] [--after 180] [--dump] [--latencies FILE]
        | --explain 200000
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.latency import TOPIC, _start_relay, produce
from bench.server import arguments, postgres

REPO = Path(__file__).resolve().parents[1]
SIZES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
       coalesce(sum(s.n_dead_tup), 0)::bigint
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'outbox\\_%'
  AND c.relnamespace = current_schema()::regnamespace
"""


# -- the harness -------------------------------------------------------------------------


class Holder(threading.Thread):
    """A session that holds a snapshot from ``start`` to ``stop`` (monotonic)."""

    def __init__(self, conninfo: str, start: float, stop: float, dump: bool) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.start_at, self.stop_at, self.dump = conninfo, start, stop, dump

    def run(self) -> None:
        import psycopg

        time.sleep(max(0.0, self.start_at - time.monotonic()))
        with psycopg.connect(self.conninfo) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM bench_accounts").fetchone()
            if self.dump:  # pg_dump's ACCESS SHARE locks on every table it reads
                tables = conn.execute(
                    "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p')"
                    " AND relname LIKE 'outbox\\_%'"
                    " AND relnamespace = current_schema()::regnamespace"
                ).fetchall()
                for (table,) in tables:
                    conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
            time.sleep(max(0.0, self.stop_at - time.monotonic()))
            conn.rollback()


def _sample(conninfo: str, t0: float, every: float, until: float, rows: list[Any]) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        while time.monotonic() < until:
            size, dead = conn.execute(SIZES).fetchone() or (0, 0)
            (pending,) = conn.execute(
                "SELECT count(*) FROM outbox_messages WHERE buried_at IS NULL"
            ).fetchone() or (0,)
            rows.append((time.monotonic() - t0, size, dead, pending))
            time.sleep(every)


def _quantiles(waits: list[float]) -> tuple[float, float]:
    if len(waits) < 2:
        return (float("nan"), float("nan"))
    cuts = statistics.quantiles(waits, n=100)
    return cuts[49], cuts[98]


def run(url: str, args: Any) -> dict[str, Any]:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_accounts (id int PRIMARY KEY)")
        conn.execute("INSERT INTO bench_accounts VALUES (1)")
    seconds = args.free + args.hold + args.after
    samples: list[Any] = []
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-held-") as tmp:
            receipts, commits = Path(tmp) / "receipts", Path(tmp) / "commits"
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
                "OUTBOX_DATABASE_URL": conninfo,
            }
            relays = [
                _start_relay({**env, "LATENCY_RECEIPTS": f"{receipts}.{n}"})
                for n in range(args.relays)
            ]
            try:
                t0 = time.monotonic()
                holder = Holder(conninfo, t0 + args.free, t0 + args.free + args.hold, args.dump)
                holder.start()
                sampler = threading.Thread(
                    target=_sample,
                    args=(conninfo, t0, args.every, t0 + seconds + 5, samples),
                    daemon=True,
                )
                sampler.start()
                produce_cmd = [sys.executable, "-m", "bench.held_snapshot", "--produce"]
                subprocess.run(
                    [*produce_cmd, conninfo, str(args.rate), str(seconds), str(commits)],
                    env=env,
                    check=True,
                )
                time.sleep(5)  # the last ones arrive
                holder.join(5)
                sampler.join(args.every + 5)
            finally:
                for relay in relays:
                    relay.send_signal(signal.SIGTERM)
                for relay in relays:
                    relay.wait(30)
            committed = [line.split() for line in commits.read_text().splitlines()]
            arrived: dict[str, str] = {}
            for n in range(args.relays):
                for line in Path(f"{receipts}.{n}").read_text().splitlines():
                    i, at = line.split()
                    if i not in arrived or float(at) < float(arrived[i]):
                        arrived[i] = at
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    start = float(committed[0][1])
    phases = {
        "free": (start, start + args.free),
        "held": (start + args.free, start + args.free + args.hold),
        "after": (start + args.free + args.hold, start + seconds),
    }
    report: dict[str, Any] = {}
    for name, (lo, hi) in phases.items():
        half = (lo + hi) / 2
        waits = sorted(
            (float(arrived[i]) - float(at)) * 1000
            for i, at, _ in committed
            if half <= float(at) < hi and i in arrived
        )
        p50, p99 = _quantiles(waits)
        first_minute = sorted(
            (float(arrived[i]) - float(at)) * 1000
            for i, at, _ in committed
            if lo <= float(at) < lo + 60 and i in arrived
        )
        report[name] = {
            "p50_ms": p50,
            "p99_ms": p99,
            "p99_first_minute_ms": _quantiles(first_minute)[1],
            "lost": sum(1 for i, at, _ in committed if lo <= float(at) < hi and i not in arrived),
            "slowest_commit_ms": max(
                (float(t) * 1000 for _, at, t in committed if lo <= float(at) < hi), default=0
            ),
        }
    report["samples"] = samples
    if args.latencies:  # every message: commit time (epoch), commit to handler (ms)
        with open(args.latencies, "w") as out:
            for i, at, _ in committed:
                if i in arrived:
                    out.write(f"{at} {(float(arrived[i]) - float(at)) * 1000:.3f}\n")
    return report


def explain(url: str, n: int) -> None:
    """Add and ack ``n`` messages under a held snapshot, then EXPLAIN the claim."""
    import anyio
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from outbox import new_message
    from outbox.postgres import PostgresStore, connect_pool, migrate
    from outbox.postgres.claims import claim_params
    from outbox.postgres.queries import QUERIES
    from outbox.requests import ClaimRequest, Orphans

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")

    async def churn(count: int) -> None:
        async with connect_pool(conninfo, max_size=2) as pool:
            store = PostgresStore(pool)
            for start in range(0, count, 1000):
                async with store.begin() as tx:
                    await store.add(
                        tx, *(new_message(TOPIC, {"n": i}) for i in range(start, start + 1000))
                    )
                while claimed := await store.claim(None, dt.timedelta(minutes=1), 400):
                    await store.ack_many([m.id for m in claimed], keyed=False)

    def plan(label: str) -> None:
        request = ClaimRequest(
            limit=100, lease=dt.timedelta(seconds=30), topics=[TOPIC], orphans=Orphans.LEAVE
        )
        with psycopg.connect(conninfo) as conn:
            rows = conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) "
                + QUERIES["message_claim"].encode(),
                claim_params(request, uuid.uuid4()),
            ).fetchall()
            conn.rollback()
        lines = [r[0] for r in rows]
        shared = [ln.strip() for ln in lines if "Buffers:" in ln][:1]
        timing = [ln.strip() for ln in lines if ln.startswith("Execution Time")]
        print(f"{label}: {'; '.join(shared + timing)}", flush=True)

    try:
        anyio.run(migrate, conninfo)
        anyio.run(churn, 1000)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox_messages")
        plan("vacuumed, nothing held")
        with psycopg.connect(conninfo) as holder:
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT 1").fetchone()
            done = 0
            for step in (n // 10, n // 2, n):
                anyio.run(churn, step - done)
                done = step
                plan(f"{done:,} acked under a held snapshot")
            front(conninfo)
            holder.rollback()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM outbox_messages")
        plan("released and vacuumed")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


READY_SCAN = (
    "SELECT id FROM outbox_messages WHERE buried_at IS NULL AND leased_until IS NULL"
    " AND due_at <= now() {} ORDER BY due_at, id LIMIT 100"
)


def front(conninfo: str) -> None:
    """The ready index read from its start, and from a low-watermark the claims
    before passed: what a claim that never walks what it passed would read."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        (mark,) = conn.execute("SELECT now()").fetchone() or (None,)
        conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
            " SELECT gen_random_uuid(), %s, '{}', now(), now() FROM generate_series(1, 100)",
            (TOPIC,),
        )
        for label, bound in (("from the start", ""), ("from a watermark", "AND due_at >= %s")):
            query = "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) " + READY_SCAN.format(bound)
            rows = conn.execute(query.encode(), (mark,) if bound else ()).fetchall()
            lines = [r[0] for r in rows]
            shared = [ln.strip() for ln in lines if "Buffers:" in ln][:1]
            timing = [ln.strip() for ln in lines if ln.startswith("Execution Time")]
            print(f"  the ready index {label}: {'; '.join(shared + timing)}", flush=True)


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--rate", type=float, default=1000, help="messages a second")
    parser.add_argument("--relays", type=int, default=1, help="relay processes")
    parser.add_argument("--free", type=float, default=180)
    parser.add_argument("--hold", type=float, default=180)
    parser.add_argument("--after", type=float, default=180)
    parser.add_argument("--every", type=float, default=15, help="seconds between samples")
    parser.add_argument("--dump", action="store_true", help="the holder reads the outbox too")
    parser.add_argument("--explain", type=int, metavar="N", help="the claim after N dead rows")
    parser.add_argument(
        "--latencies", metavar="FILE", help="write each message's commit time and latency"
    )
    parser.add_argument("--produce", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        url, rate, seconds, out = args.produce
        produce(url, float(rate), float(seconds), out, batch=10)
        return 0
    with postgres(args.database_url) as url:
        if args.explain:
            explain(url, args.explain)
            return 0
        got = run(url, args)
    free = [s for s in got["samples"] if s[0] < args.free]
    held_end = [s for s in got["samples"] if s[0] <= args.free + args.hold][-1:]
    free_size = max((s[1] for s in free), default=0)
    print(f"{args.rate:.0f} msg/s, {args.relays} relay(s); phases free {args.free:.0f} s,"
          f" held {args.hold:.0f} s{' (reading the outbox)' if args.dump else ''},"
          f" after {args.after:.0f} s")  # fmt: skip
    for name in ("free", "held", "after"):
        r = got[name]
        print(
            f"{name}: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms (second half);"
            f" p99 first minute {r['p99_first_minute_ms']:.1f} ms;"
            f" slowest commit {r['slowest_commit_ms']:.0f} ms; undelivered {r['lost']}"
        )
    for at, size, dead, pending in got["samples"]:
        print(
            f"  t={at:6.0f} s  relations {size / 2**20:7.1f} MiB"
            f" ({size / free_size if free_size else float('nan'):.2f}x free)"
            f"  dead rows {dead:>9,}  pending {pending:>8,} ({pending / args.rate:.1f} s)"
        )
    if held_end:
        _, size, _, pending = held_end[0]
        print(
            f"end of the hold: {pending / args.rate:.1f} s of production pending;"
            f" relations {size / free_size if free_size else float('nan'):.2f}x free"
        )
    # The ring empties a slot every few seconds: its size is a saw, so each
    # phase's largest sample is compared with the free phase's largest.
    end = args.free + args.hold
    for name, lo, hi in (("held", args.free, end), ("the 5 min after", end, end + 300)):
        sizes = [s[1] for s in got["samples"] if lo < s[0] <= hi]
        if sizes and free_size:
            print(f"largest, {name}: {max(sizes) / 2**20:.1f} MiB ({max(sizes) / free_size:.2f}x"
                  f" the free phase's largest, {free_size / 2**20:.1f} MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
