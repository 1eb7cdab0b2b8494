"""The relay behind PgBouncer in transaction mode against the relay reached directly.

For each route, in a database of its own on one PostgreSQL (a pooler cannot
pin a search_path): two real ``outbox relay`` processes at the defaults and
two producers committing one message at a time (``store.begin()``) at a
steady rate, all through the route; commit to handler p50 and p99, what the
relays' logs say went wrong (prepared-statement errors, acks given up, lost
leases). Then a drain: N messages added at once, one relay at batch 100, time
until the last arrives. Routes:

- direct: every connection to PostgreSQL itself;
- pgbouncer: relays and producers through PgBouncer 1.18 (pool_mode=transaction,
  server_round_robin), the relays' listener through OUTBOX_LISTEN_URL (direct);
- pgbouncer-no-listen: the same without OUTBOX_LISTEN_URL (wake-ups off, polling).

    python -m bench pooler [--database-url URL] [--rate 100] [--seconds 15] [--drain 20000]

Needs Debian's pgbouncer. Figures and the command that made them live in
BENCHMARKS.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.latency import TOPIC, _free_port, _ready
from bench.server import arguments

REPO = Path(__file__).resolve().parents[1]

TROUBLE = {
    "prepared statement": "prepared",
    "could not ack": "acks given up",
    "lease lost": "leases lost",
    "wake-ups are off": "wake-ups off",
}


def _relay(env: dict[str, str], log: Path, **extra: str) -> subprocess.Popen[bytes]:
    port = _free_port()
    with log.open("ab") as out:
        relay = subprocess.Popen(
            [sys.executable, "-m", "outbox.service.cli", "relay"],
            env={**env, "OUTBOX_HTTP_HOST": "127.0.0.1", "OUTBOX_HTTP_PORT": str(port), **extra},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    _ready(port)
    return relay


def _add_many(url: str, n: int) -> None:
    import psycopg

    from outbox import new_message
    from outbox.postgres import add_sync

    with psycopg.connect(url, prepare_threshold=None) as conn:
        for start in range(0, n, 1000):
            with conn.transaction():
                add_sync(conn, *(new_message(TOPIC, {"n": i}) for i in range(start, start + 1000)))


def route(name: str, direct: str, rate: float, seconds: float, drain: int) -> dict[str, Any]:
    from contextlib import nullcontext

    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from tools.pgbouncer import pgbouncer, warm

    db = f"bench_pool_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    own = make_conninfo(direct, dbname=db)
    binary = shutil.which("pgbouncer") or "pgbouncer"
    pooled = pgbouncer(own, binary) if name.startswith("pgbouncer") else nullcontext(own)
    try:
        with pooled as url, tempfile.TemporaryDirectory(prefix="outbox-pooler-") as tmp:
            if url != own:
                warm(url)
            receipts, log = Path(tmp) / "receipts", Path(tmp) / "relays.log"
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
                "OUTBOX_DATABASE_URL": url,
                "OUTBOX_HANDLERS": "bench.latency:handlers",
                "OUTBOX_LOG_LEVEL": "info",
                "LATENCY_RECEIPTS": str(receipts),
            }
            if name == "pgbouncer":
                env["OUTBOX_LISTEN_URL"] = own
            cli = [sys.executable, "-m", "outbox.service.cli"]
            subprocess.run([*cli, "migrate"], env={**env, "OUTBOX_DATABASE_URL": own}, check=True)
            relays = [_relay(env, log) for _ in range(2)]
            time.sleep(2)  # past the start-up's first claims
            commits = [Path(tmp) / f"commits{i}" for i in range(2)]
            produce = [sys.executable, "-m", "bench.latency", "--produce", url]
            producers = [
                subprocess.Popen([*produce, str(rate), str(seconds), str(path)], env=env)
                for path in commits
            ]
            for p in producers:
                p.wait()
            time.sleep(3)  # the last ones arrive
            for r in relays:
                r.send_signal(signal.SIGTERM)
                r.wait(30)
            committed = dict(
                line.split()[:2] for path in commits for line in path.read_text().splitlines()
            )
            arrived: dict[str, str] = {}
            for line in receipts.read_text().splitlines():
                i, t = line.split()
                arrived.setdefault(i, t)
            waits = sorted(
                (float(arrived[i]) - float(t)) * 1000 for i, t in committed.items() if i in arrived
            )
            text = log.read_text()
            trouble = {label: text.count(needle) for needle, label in TROUBLE.items()}

            receipts.write_text("")
            _add_many(own, drain)
            started = time.monotonic()
            relay = _relay(env, log, OUTBOX_BATCH="100")
            while len(receipts.read_text().splitlines()) < drain:
                time.sleep(0.05)
            rate_drained = drain / (time.monotonic() - started)
            relay.send_signal(signal.SIGTERM)
            relay.wait(30)
    finally:
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db)))
    cuts = statistics.quantiles(waits, n=100)
    return {
        "route": name,
        "arrived": f"{len(waits)}/{len(committed)}",
        "p50_ms": cuts[49],
        "p99_ms": cuts[98],
        "drain": rate_drained,
        **trouble,
    }


def main() -> int:
    parser = arguments(__doc__, local=True)
    parser.add_argument("--rate", type=float, default=100, help="commits a second per producer")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument(
        "--routes", default="direct,pgbouncer,pgbouncer-no-listen", help="comma-separated"
    )
    args = parser.parse_args()
    rows = [
        route(name, args.database_url, args.rate, args.seconds, args.drain)
        for name in args.routes.split(",")
    ]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("| " + " | ".join("---" for _ in keys) + " |")
    for row in rows:
        cells = [f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
