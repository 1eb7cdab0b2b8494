"""The operator console (`outbox ui`) on a large outbox: each page's and read's
latency, and a relay's drain while the console serves a load of reads.

Reads: 1,000,000 pending and 100,000 buried messages over 200 topics (a tenth
of them keyed, a hundredth due later), the relays' backlog measured once, a
real `outbox ui` process; one user reads each page and API call --samples
times in turn; p50 / p95 each (targets: every read 150 ms at p95, the
overview's counts 50 ms, a filter by error text over the buried ones 1 s).
Then one bulk requeue of every buried message (100,000) and its time.

Measure: the relays' shared backlog measurement (the statement a relay runs
every backlog interval, a read of every row) on the same data, this tree's
against --baseline's, alternating --rounds times, without keeping it.

Drain: --rounds alternating pairs of a relay draining --messages (beside the
100,000 buried) alone and while the console serves --rate requests a second
of mixed reads from a separate process; the ratio of each pair's drain rates
and their median (target: at least 0.9x).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.server import arguments, listening, postgres

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-operator-token-0123456789"
TOPICS = 200
ERRORS = (
    "receiver answered 503 Service Unavailable",
    "connection refused",
    "receiver timed out after 10s",
    "550 5.1.1 mailbox unavailable",
)
RARE = "certificate has expired"
"""The error text of one buried message in ten thousand: what an operator hunts for."""


def fill(conninfo: str, pending: int, buried: int, keyed: float = 0.1) -> None:
    """``pending`` and ``buried`` messages over TOPICS topics, by COPY."""
    from outbox import new_message

    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    rng = random.Random(7)
    with psycopg.connect(conninfo) as conn, conn.cursor() as cur:
        # Hours old: where a relay's rotation has moved them, the long-stay partition.
        columns = (
            "id, topic, payload, created_at, due_at, key, buried_at, last_error, attempts, slot"
        )
        with cur.copy(f"COPY outbox_messages ({columns}) FROM STDIN") as copy:
            for i in range(pending + buried):
                topic = f"bench.topic{i % TOPICS:03d}"
                at = t0 + dt.timedelta(microseconds=i * 7)
                m = new_message(topic, {"n": i, "to": "user@example.com"}, at)
                key = f"k{rng.randrange(5000)}" if rng.random() < keyed else None
                if i < pending:
                    due = at + dt.timedelta(days=1) if i % 100 == 0 else at
                    row = (m.id, topic, m.payload.decode(), at, due, key, None, None, 0, -1)
                    copy.write_row(row)
                else:
                    error = RARE if i % 10_000 == 0 else ERRORS[i % len(ERRORS)]
                    row = (m.id, topic, m.payload.decode(), at, at, key, at, error, 5, -1)
                    copy.write_row(row)
        conn.commit()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox_messages")


@contextmanager
def schema(url: str) -> Iterator[str]:
    """A migrated schema of its own; dropped afterwards."""
    import anyio

    from outbox.postgres import migrate

    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    conninfo = make_conninfo(url, options=f"-c search_path={name}")
    try:
        anyio.run(migrate, conninfo)
        yield conninfo
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def measure_backlog(conninfo: str) -> None:
    """The relays' shared measurement, as a relay keeps it."""
    import anyio

    from outbox.postgres import PostgresStore, connect_pool

    async def main() -> None:
        async with connect_pool(conninfo, max_size=1) as pool:
            await PostgresStore(pool).topic_stats(max_age=dt.timedelta(0))

    anyio.run(main)


@contextmanager
def console(conninfo: str, tmp: Path) -> Iterator[str]:
    """A real `outbox ui` on ``conninfo``; yields its base URL."""
    tokens = tmp / "tokens"
    tokens.write_text(f"bench operator {TOKEN}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": conninfo,
        "OUTBOX_UI_PORT": str(port),
        "OUTBOX_UI_TOKENS_FILE": str(tokens),
        "OUTBOX_LOG_LEVEL": "warning",
        "PYTHONPATH": str(REPO / "src"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox.service.cli", "ui"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        listening(port, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(15)


def reads(base: str, conninfo: str) -> dict[str, str]:
    """The pages and API calls timed: name → path."""
    with psycopg.connect(conninfo) as conn:
        [(some_id,)] = conn.execute("SELECT id FROM outbox_messages WHERE key IS NOT NULL LIMIT 1")
        [(buried_id,)] = conn.execute(
            "SELECT id FROM outbox_messages WHERE buried_at IS NOT NULL LIMIT 1"
        )
    return {
        "overview page": "/",
        "overview counts (API)": "/api/v1/topics",
        "messages page": "/messages",
        "messages: pending of a topic": "/messages?topic=bench.topic042&state=pending",
        "messages: due later": "/messages?state=due_later",
        "messages: in flight": "/messages?state=in_flight",
        "messages: parked": "/messages?state=parked",
        "messages: one key": "/messages?topic=bench.topic007&key=k7",
        "message page": f"/messages/{some_id}",
        "buried page": "/buried",
        "buried of a topic": "/buried?topic=bench.topic042",
        "buried message page": f"/messages/{buried_id}",
        "blocked keys": "/keys",
        "relays": "/relays",
        "topics page": "/topics",
        "API: messages": "/api/v1/messages?state=pending&limit=100",
        "API: blocked keys": "/api/v1/keys/blocked",
        "buried by error text (rare)": f"/buried?error_contains={RARE.replace(' ', '+')}",
        "buried by error text (common)": "/buried?error_contains=timed+out",
    }


async def time_reads(base: str, paths: dict[str, str], samples: int) -> dict[str, list[float]]:
    import aiohttp

    headers = {"Authorization": f"Bearer {TOKEN}"}
    taken: dict[str, list[float]] = {name: [] for name in paths}
    async with aiohttp.ClientSession(headers=headers) as session:
        for _ in range(samples):
            for name, path in paths.items():
                started = time.perf_counter()
                async with session.get(base + path) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"{name}: {r.status} {(await r.text())[:200]}")
                taken[name].append((time.perf_counter() - started) * 1000)
    return taken


async def bulk_requeue(base: str) -> tuple[int, float]:
    import aiohttp

    headers = {"Authorization": f"Bearer {TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        started = time.perf_counter()
        body = {"filter": {"all": True}}
        async with session.post(base + "/api/v1/buried/requeue", json=body) as r:
            done = await r.json()
        return int(done["count"]), time.perf_counter() - started


def load(base: str, rate: float, seconds: float, paths: list[str]) -> None:
    """--load: ``rate`` requests a second of ``paths`` in turn, for ``seconds``."""
    import aiohttp

    async def main() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        sent = failed = 0
        async with aiohttp.ClientSession(headers=headers) as session:

            async def one(path: str) -> None:
                nonlocal failed
                try:
                    async with session.get(base + path) as r:
                        await r.read()
                        failed += r.status != 200
                except aiohttp.ClientError:
                    failed += 1

            tasks = set()
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                task = asyncio.create_task(one(paths[sent % len(paths)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                await asyncio.sleep(max(started + sent / rate - time.monotonic(), 0))
            await asyncio.gather(*tasks)
        took = time.monotonic() - started
        print(json.dumps({"sent": sent, "failed": failed, "rate": sent / took}), flush=True)

    asyncio.run(main())


def drain(conninfo: str, n: int) -> float:
    """A relay drains the ``n`` pending messages; its rate."""
    import anyio
    from prometheus_client import CollectorRegistry

    from outbox import Message, Relay, RelayConfig
    from outbox.postgres import PostgresStore, connect_pool

    async def main() -> float:
        done = anyio.Event()
        seen = [0]

        async def noop(m: Message) -> None:
            seen[0] += 1
            if seen[0] >= n:
                done.set()

        handlers = {f"bench.topic{k:03d}": noop for k in range(TOPICS)}
        cfg = RelayConfig.model_validate({"batch": 100, "interval": "10ms"})
        async with connect_pool(conninfo, min_size=2, max_size=4) as pool:
            relay = Relay(PostgresStore(pool), handlers, cfg, registry=CollectorRegistry())
            async with anyio.create_task_group() as tg:
                started = time.perf_counter()
                tg.start_soon(relay.run)
                await done.wait()
                took = time.perf_counter() - started
                relay.stop()
        return n / took

    return anyio.run(main)


def drain_round(url: str, n: int, rate: float, tmp: Path) -> float:
    with schema(url) as conninfo:
        fill(conninfo, 0, 100_000)
        fill_due(conninfo, n)
        if not rate:
            return drain(conninfo, n)
        with console(conninfo, tmp) as base:
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            loader = subprocess.Popen(
                [sys.executable, "-m", "bench.console", "--load", base, "--rate", str(rate)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                time.sleep(1)  # the load is running before the drain starts
                return drain(conninfo, n)
            finally:
                loader.terminate()
                loader.wait(15)


def fill_due(conninfo: str, n: int) -> None:
    from outbox import new_message

    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    with psycopg.connect(conninfo) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY outbox_messages (id, topic, payload, created_at, due_at) FROM STDIN"
        ) as copy:
            for i in range(n):
                at = t0 + dt.timedelta(microseconds=i)
                m = new_message(f"bench.topic{i % TOPICS:03d}", {"n": i}, at)
                copy.write_row((m.id, m.topic, m.payload.decode(), at, at))
        conn.commit()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox_messages")


def measure_statements(conninfo: str, baseline: str, rounds: int) -> None:
    """The backlog measurement's statement, this tree's and ``baseline``'s, in turn."""
    import re

    from outbox.postgres.queries import QUERIES

    old_text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{baseline}:src/outbox/postgres/sql/queries.sql"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    parts = re.split(r"^-- ([a-z_]+) --$", old_text, flags=re.MULTILINE)
    old = dict(zip(parts[1::2], parts[2::2], strict=True))["backlog_measure_blocked"]
    params = {"scan": 10_000, "keep": False}
    ratios = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for r in range(rounds):
            took = {}
            both = [("current", QUERIES["backlog_measure_blocked"]), ("baseline", old)]
            for name, text in both if r % 2 == 0 else both[::-1]:
                started = time.perf_counter()
                conn.execute(text, params).fetchall()  # type: ignore[call-overload]
                took[name] = time.perf_counter() - started
            ratios.append(took["baseline"] / took["current"])
            print(
                f"backlog measurement: {took['current'] * 1000:.0f} ms, {baseline}'s "
                f"{took['baseline'] * 1000:.0f} ms: {ratios[-1]:.2f}x"
            )
    print(f"median {statistics.median(ratios):.2f}x (the baseline's time over this tree's)")


def main() -> int:
    parser = arguments(__doc__, rounds=3, baseline=True)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--buried", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--messages", type=int, default=50_000, help="drained a round")
    parser.add_argument("--rate", type=float, default=200, help="console requests a second")
    parser.add_argument("--only", choices=("reads", "measure", "drain"), help="one part only")
    parser.add_argument("--load", help=argparse_suppress())
    args = parser.parse_args()
    if args.load:
        paths = ["/", "/api/v1/topics", "/messages?state=pending", "/buried", "/keys", "/relays"]
        load(args.load, args.rate, 3600, paths)
        return 0
    with postgres(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "measure"):
            with schema(url) as conninfo:
                fill(conninfo, args.pending, args.buried)
                measure_statements(conninfo, args.baseline, max(args.rounds, 5))
        if args.only in (None, "reads"):
            with schema(url) as conninfo:
                started = time.perf_counter()
                fill(conninfo, args.pending, args.buried)
                print(
                    f"filled {args.pending:,} pending and {args.buried:,} buried over {TOPICS} "
                    f"topics in {time.perf_counter() - started:.0f} s"
                )
                measure_backlog(conninfo)
                with console(conninfo, Path(tmp)) as base:
                    paths = reads(base, conninfo)
                    taken = asyncio.run(time_reads(base, paths, args.samples))
                    print(f"\n{'read':<34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
                    for name, values in taken.items():
                        values.sort()
                        p95 = values[min(int(len(values) * 0.95), len(values) - 1)]
                        print(
                            f"{name:<34} {statistics.median(values):8.1f} {p95:8.1f} "
                            f"{values[-1]:8.1f}"
                        )
                    count, took = asyncio.run(bulk_requeue(base))
                    print(f"\nbulk requeue of every buried message: {count:,} in {took:.1f} s")
        if args.only in (None, "drain"):
            print(
                f"\ndrain of {args.messages:,} beside 100,000 buried, alone and with the "
                f"console serving {args.rate:.0f} reads/s"
            )
            ratios = []
            for r in range(args.rounds):
                order = (0.0, args.rate) if r % 2 == 0 else (args.rate, 0.0)
                rates = {rate: drain_round(url, args.messages, rate, Path(tmp)) for rate in order}
                ratio = rates[args.rate] / rates[0.0]
                ratios.append(ratio)
                print(
                    f"round {r + 1}: alone {rates[0.0]:,.0f} msg/s, under load "
                    f"{rates[args.rate]:,.0f} msg/s: {ratio:.2f}x"
                )
            print(f"median {statistics.median(ratios):.2f}x")
    return 0


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
