"""Commit to handler: how long a message waits for a relay at the design defaults.

For each system (the working tree, and an earlier commit exported from git),
in a fresh schema on one PostgreSQL: a real ``outbox relay`` process with the
defaults (interval 1s, batch 10) and a handler that notes when each message
arrives; a producer that commits one message at a time through
``store.begin()`` at a steady rate and notes when each commit returned. Then
the relay's CPU while nothing arrives.

    python -m bench latency [--database-url URL] [--baseline REF] [--rate 200] [--seconds 15]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started. Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.server import arguments, postgres

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
TOPIC = "bench.latency"


# -- in the relay process ---------------------------------------------------------------


def handlers() -> dict[str, Any]:
    """OUTBOX_HANDLERS for the relay under test: note each arrival, with its time."""
    out = open(os.environ["LATENCY_RECEIPTS"], "a", buffering=1)  # noqa: SIM115 - the process's

    async def note(m: Any) -> None:
        out.write(f"{m.id} {time.time()}\n")

    return {TOPIC: note}


# -- in the producer process ------------------------------------------------------------


def produce(url: str, rate: float, seconds: float, out_path: str, batch: int = 1) -> None:
    """Commit ``batch`` messages (one transaction) every batch/rate s through
    store.begin(); note, a line a message, its id, when its commit returned and
    how long the commit took."""
    import anyio

    lines: list[str] = []

    async def go() -> None:
        from outbox import new_message
        from outbox.postgres import PostgresStore, connect_pool

        async with connect_pool(url, max_size=1) as pool:
            store = PostgresStore(pool)
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < seconds:
                msgs = [new_message(TOPIC, {"n": n + i}) for i in range(batch)]
                began = time.perf_counter()
                async with store.begin() as tx:
                    await store.add(tx, *msgs)
                took, at = time.perf_counter() - began, time.time()
                lines.extend(f"{m.id} {at} {took}\n" for m in msgs)
                n += batch
                await anyio.sleep(max(0.0, start + n / rate - time.monotonic()))

    anyio.run(go)
    Path(out_path).write_text("".join(lines))


# -- pgqueuer, the same way -------------------------------------------------------------


def pgqueuer_consume(url: str, receipts: str) -> None:
    """A pgqueuer worker with its defaults (batch 10), noting each job's arrival."""
    import asyncio

    import psycopg
    from pgqueuer import Job, PgQueuer, PsycopgDriver

    async def go() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        pgq = PgQueuer(PsycopgDriver(conn))
        out = open(receipts, "a", buffering=1)  # noqa: SIM115, ASYNC230 - the process's

        @pgq.entrypoint(TOPIC)
        async def note(job: Job) -> None:
            out.write(f"{(job.payload or b'').decode()} {time.time()}\n")

        await pgq.run()

    asyncio.run(go())


def pgqueuer_produce(url: str, rate: float, seconds: float, out_path: str) -> None:
    """Enqueue one job every 1/rate s (its own transaction); note each return."""
    import asyncio

    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    lines: list[str] = []

    async def go() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        queries = Queries(PsycopgDriver(conn))
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            job = str(uuid.uuid4())
            await queries.enqueue(TOPIC, job.encode())
            lines.append(f"{job} {time.time()}\n")
            n += 1
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
        await conn.close()

    asyncio.run(go())
    Path(out_path).write_text("".join(lines))


# -- the harness ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the relay did not become ready")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_relay(env: dict[str, str]) -> subprocess.Popen[bytes]:
    cli = [sys.executable, "-m", "outbox.service.cli"]
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
    port = _free_port()
    relay = subprocess.Popen(
        [*cli, "relay"],
        env={
            **env,
            "OUTBOX_HANDLERS": "bench.latency:handlers",
            "OUTBOX_HTTP_HOST": "127.0.0.1",
            "OUTBOX_HTTP_PORT": str(port),
            "OUTBOX_LOG_LEVEL": "warning",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _ready(port)
    time.sleep(2)  # past the start-up's first claims
    return relay


def _start_pgqueuer(conninfo: str, receipts: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    import asyncio

    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async def install() -> None:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        await Queries(PsycopgDriver(conn)).install(create_schema=False)
        await conn.close()

    asyncio.run(install())
    worker = subprocess.Popen(
        [sys.executable, "-m", "bench.latency", "--pgqueuer-consume", conninfo, str(receipts)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(3)  # the worker connects and listens; it has no readiness to ask
    return worker


def run(src: Path | None, url: str, rate: float, seconds: float, idle: float) -> dict[str, Any]:
    """One system: outbox from ``src``, or pgqueuer when ``src`` is None."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    with tempfile.TemporaryDirectory(prefix="outbox-latency-") as tmp:
        receipts, commits = Path(tmp) / "receipts", Path(tmp) / "commits"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
            "PYTHONPATH": os.pathsep.join([str(src or REPO / "src"), str(REPO)]),
            "OUTBOX_DATABASE_URL": conninfo,
            "LATENCY_RECEIPTS": str(receipts),
        }
        producer = [
            sys.executable,
            "-m",
            "bench.latency",
            "--produce",
            conninfo,
            str(rate),
            str(seconds),
        ]
        if src is None:
            relay = _start_pgqueuer(conninfo, receipts, env)
            producer[2] = "--pgqueuer-produce"
        else:
            relay = _start_relay(env)
        try:
            subprocess.run([*producer, str(commits)], env=env, check=True)
            time.sleep(2)  # the last ones arrive
            cpu = _cpu_seconds(relay.pid)
            time.sleep(idle)
            idle_cores = (_cpu_seconds(relay.pid) - cpu) / idle
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(30)
        committed = dict(line.split()[:2] for line in commits.read_text().splitlines())
        arrived = dict(line.split() for line in receipts.read_text().splitlines())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    waits = sorted(
        (float(arrived[i]) - float(t)) * 1000 for i, t in committed.items() if i in arrived
    )
    cuts = statistics.quantiles(waits, n=100)
    return {
        "messages": len(committed),
        "arrived": len(waits),
        "p50_ms": cuts[49],
        "p99_ms": cuts[98],
        "idle_cores": idle_cores,
    }


def main() -> int:
    parser = arguments(__doc__, baseline=True)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--idle", type=float, default=10, help="seconds of idle CPU to measure")
    parser.add_argument("--produce", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--pgqueuer-produce", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--pgqueuer-consume", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        url, rate, seconds, out = args.produce
        produce(url, float(rate), float(seconds), out)
        return 0
    if args.pgqueuer_produce:
        url, rate, seconds, out = args.pgqueuer_produce
        pgqueuer_produce(url, float(rate), float(seconds), out)
        return 0
    if args.pgqueuer_consume:
        pgqueuer_consume(*args.pgqueuer_consume)
        return 0
    from bench.pipeline import export

    with postgres(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        systems: dict[str, Path | None] = {
            "baseline": export(args.baseline, Path(tmp)),
            "current": REPO / "src",
            "pgqueuer": None,
        }
        print(
            f"commit -> handler, {args.rate:.0f} msg/s for {args.seconds:.0f} s, interval 1s, "
            f"batch 10 (pgqueuer: its defaults); baseline {args.baseline}"
        )
        for name, src in systems.items():
            got = run(src, url, args.rate, args.seconds, args.idle)
            print(
                f"{name}: {got['arrived']}/{got['messages']} arrived, p50 {got['p50_ms']:.1f} ms, "
                f"p99 {got['p99_ms']:.1f} ms; idle relay {got['idle_cores']:.3f} cores",
                flush=True,
            )
            print(json.dumps({name: got}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
