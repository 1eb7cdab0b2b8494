"""A relay's memory: idle, per served topic and per payload byte in flight.

Starts real `outbox relay` processes against a fresh schema each and reads
their peak RSS (VmHWM) after each case:

- idle: no messages, no registry entries;
- registry: --topics registry entries (log handler), idle;
- in flight: --payloads messages of --size bytes, delivered by a handler that
  holds each for --hold seconds, so the relay keeps OUTBOX_IN_FLIGHT_BYTES of
  payloads (32 MiB by default) in flight.

The README's memory budget and the chart's default limits come from these.

    python -m bench memory [--database-url URL]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.server import arguments, postgres
from outbox.postgres import migrate

REPO = Path(__file__).resolve().parents[1]


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def schema(url: str) -> Iterator[str]:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    options = conninfo_to_dict(url).get("options") or ""
    conninfo = make_conninfo(url, options=f"{options} -c search_path={name}".strip())
    try:
        asyncio.run(migrate(conninfo))
        yield conninfo
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def relay(conninfo: str, until: str, **env: str) -> float:
    """Run a relay until the SQL ``until`` is true (or 60 s); return its peak RSS in MiB."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    environ.update(
        OUTBOX_DATABASE_URL=conninfo,
        OUTBOX_HTTP_HOST="127.0.0.1",
        OUTBOX_HTTP_PORT=str(port),
        OUTBOX_INTERVAL="100ms",
        OUTBOX_LOG_LEVEL="warning",
        PYTHONPATH=os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")]),
        **env,
    )
    proc = subprocess.Popen([sys.executable, "-m", "outbox.service.cli", "relay"], env=environ)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            except OSError:
                time.sleep(0.1)
                continue
            with psycopg.connect(conninfo, autocommit=True) as conn:
                if conn.execute(until.encode()).fetchone() == (True,):
                    break
            time.sleep(0.2)
        return peak_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--topics", type=int, default=500)
    parser.add_argument("--payloads", type=int, default=200)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--hold", type=float, default=0.5)
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        with schema(url) as db:
            idle = relay(db, "SELECT count(*) > 0 FROM outbox_relays")
        with schema(url) as db:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO outbox_topics (topic, enabled, handler, config, updated_at)"
                    " SELECT 'bench.' || n, true, 'log', '{}', now()"
                    " FROM generate_series(1, %s) AS n",
                    (args.topics,),
                )
            registry = relay(db, "SELECT count(*) > 0 FROM outbox_relays")
        with schema(url) as db:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
                    " SELECT gen_random_uuid(), 'bench.hold',"
                    " json_build_object('blob', repeat('x', %s)), now(), now()"
                    " FROM generate_series(1, %s)",
                    (args.size, args.payloads),
                )
            held = relay(
                db,
                "SELECT count(*) = 0 FROM outbox_messages",
                OUTBOX_HANDLERS="bench.hold_handler:handlers",
                BENCH_HOLD=str(args.hold),
            )
    print(f"idle relay: peak RSS {idle:.0f} MiB")
    print(
        f"{args.topics} registry topics: peak RSS {registry:.0f} MiB"
        f" (+{(registry - idle) * 1024 / args.topics:.0f} KiB a topic)"
    )
    print(
        f"{args.payloads} payloads of {args.size:,} bytes through OUTBOX_IN_FLIGHT_BYTES"
        f" (32 MiB): peak RSS {held:.0f} MiB (+{held - idle:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
