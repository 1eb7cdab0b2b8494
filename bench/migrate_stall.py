"""How long producers wait while `outbox migrate` upgrades a large table.

The schema of the release before migrations 7 and 8 (the index builds),
``--rows`` pending messages, producers committing one message at a time
(``--producers`` threads, each as fast as it can), and one use case holding
its transaction open for ``--hold`` seconds when migrate starts. Then
``outbox migrate`` of each system (the working tree, and ``--baseline``,
exported from git: by default the release before migrations ran under
lock_timeout and built indexes CONCURRENTLY), in a fresh schema each, in one
run. Reported: every producer commit during migrate, its max and p99, and
how long migrate took.

    python -m bench migrate_stall [--database-url URL] [--rows 1000000] [--baseline REF]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.pipeline import export
from bench.server import arguments

REPO = Path(__file__).resolve().parents[1]

BASELINE = "35a5a1d^"


def run(src: Path, url: str, rows: int, producers: int, hold: float) -> dict[str, Any]:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from tools.upgrade import earlier_release, writing

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    try:
        earlier_release(conninfo, rows)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox_messages")
        env = {**os.environ, "PYTHONPATH": str(src), "OUTBOX_DATABASE_URL": conninfo}
        with writing(conninfo, producers=producers, hold=hold, pace=0) as waits:
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "outbox.service.cli", "migrate"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            took = time.monotonic() - started
            during = list(waits)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    cuts = statistics.quantiles(during, n=100)
    return {
        "commits": len(during),
        "max_ms": max(during) * 1000,
        "p99_ms": cuts[98] * 1000,
        "p50_ms": cuts[49] * 1000,
        "migrate_s": took,
    }


def main() -> int:
    parser = arguments(__doc__, baseline=True, local=True)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--hold", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="outbox-baseline-") as tmp:
        systems = {"baseline": export(args.baseline, Path(tmp)), "current": REPO / "src"}
        print(f"{args.rows:,} rows, {args.producers} producers, a transaction open {args.hold}s")
        print("| system | commits during migrate | max | p99 | p50 | migrate took |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, src in systems.items():
            r = run(src, args.database_url, args.rows, args.producers, args.hold)
            print(
                f"| {name} | {r['commits']:,} | {r['max_ms']:,.0f} ms | {r['p99_ms']:,.0f} ms"
                f" | {r['p50_ms']:,.1f} ms | {r['migrate_s']:.1f} s |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
