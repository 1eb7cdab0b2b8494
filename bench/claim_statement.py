"""The claim statement alone: the working tree's against an earlier commit's, no relay.

Each side gets a fresh schema built by its own migrations, N due messages, and
a loop that claims 100 (--limit) and acks the batch claimed four claims earlier (so 400
rows are in flight, as with a relay's default concurrency) until the table is
empty. Prints messages per second per round, side by side.

    python -m bench claim_statement [--database-url URL] [--baseline REF]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.server import arguments, postgres
from outbox.postgres.claims import EVERY_SLOT, claim_statement
from outbox.postgres.schema import statements

REPO = Path(__file__).resolve().parents[1]
SQL = "src/outbox/postgres/sql"
IN_FLIGHT = 4


def _source(rev: str | None, path: str) -> str:
    if rev is None:
        return (REPO / path).read_text()
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout


def _migrations(rev: str | None) -> list[str]:
    if rev is None:
        names = sorted(p.name for p in (REPO / SQL / "migrations").glob("*.sql"))
    else:
        listed = subprocess.run(
            ["git", "ls-tree", "--name-only", rev, f"{SQL}/migrations/"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        names = sorted(Path(line).name for line in listed.split())
    return [_source(rev, f"{SQL}/migrations/{name}") for name in names]


def _queries(rev: str | None) -> dict[str, str]:
    parts = re.split(r"^-- (\w+) --$", _source(rev, f"{SQL}/queries.sql"), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@contextmanager
def migrated_at(url: str, rev: str | None) -> Iterator[psycopg.Connection[Any]]:
    """A connection to a fresh schema built by ``rev``'s migrations (None: the working tree's)."""
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
            for migration in _migrations(rev):
                # Index builds that run CONCURRENTLY go one statement at a time.
                if migration.startswith("-- outbox: no transaction"):
                    for statement in statements(migration):
                        conn.execute(statement.encode())
                else:
                    conn.execute(migration.encode())
            yield conn
        finally:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def topics_param(claim: bytes, topics: list[str]) -> list[str] | str:
    """``topics`` as the side's claim statement takes them: an array, or joined by commas."""
    return ",".join(topics) if b"string_to_array(%(topics)s" in claim else topics


def _form(every: bool) -> str:
    """The form of message_claim the working tree's relays run for this claim."""
    return str(claim_statement({"by_topic": not every, "capped": [], "a": "-infinity"}))


def drain(url: str, rev: str | None, n: int, limit: int = 100, every: bool = False) -> float:
    with migrated_at(url, rev) as conn:
        conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at) "
            "SELECT gen_random_uuid(), 'orders.placed', '{}', t, t "
            "FROM (SELECT now() - interval '1 hour' + i * interval '1 ms' AS t "
            "      FROM generate_series(1, %s) AS i) AS s",
            (n,),
        )
        conn.execute("VACUUM ANALYZE outbox_messages")
        # The ring's slots the rows went to, which a relay's claims read (not
        # every partition); earlier commits have no slot.
        slots = list(EVERY_SLOT)
        if rev is None:
            row = conn.execute("SELECT array_agg(DISTINCT slot) FROM outbox_messages").fetchone()
            slots = row[0] if row else slots
        queries = _queries(rev)
        # The working tree's relays run one form of the statement (claims.FORMS).
        claim = (queries["message_claim"] if rev else _form(every)).encode()
        # What a relay acks an unkeyed batch with (message_ack_many before keys).
        ack = (queries.get("message_ack_unkeyed") or queries["message_ack_many"]).encode()
        params = {
            "now": None,
            "lease": "2 min",
            "limit": limit,
            # A relay of every topic (or of more than BY_TOPIC) claims without a list.
            "topics": None if every else topics_param(claim, ["orders.placed"]),
            "capped": [],
            "caps": [],
            "isolate": True,
            "solo": False,
            "max_bytes": 32 * 1024 * 1024,  # what relays pass (earlier commits ignore it)
            "by_topic": not every,  # one topic, as the store claims it
            "after": None,  # no watermark: no snapshot held (earlier commits ignore it)
            "a": "-infinity",  # the same, since the ring
            "slots": slots,  # (earlier commits ignore it)
        }
        acks = {"tokens": None, "slots": slots}
        done, elapsed = claim_and_ack(conn, claim, ack, params, acks)
    assert done == n, f"{done} of {n} acked"
    return n / elapsed


def claim_and_ack(
    conn: psycopg.Connection[Any],
    claim: bytes,
    ack: bytes,
    params: dict[str, Any],
    acks: dict[str, Any],
    prepare: bool | None = None,
) -> tuple[int, float]:
    """Claim until nothing is left, acking IN_FLIGHT claims behind: (acked, seconds).
    ``prepare``: psycopg's (None: prepared after a few runs; False: never, as relays)."""
    in_flight: list[list[uuid.UUID]] = []
    done = 0
    started = time.perf_counter()
    while True:
        token = {"token": uuid.uuid4()}
        rows = conn.execute(claim, {**params, **token}, prepare=prepare).fetchall()
        ids = [r[0] for r in rows if r[0] is not None]
        if not ids and not in_flight:
            break
        if ids:
            in_flight.append(ids)
        if len(in_flight) > IN_FLIGHT or not ids:
            batch = in_flight.pop(0)
            conn.execute(ack, {**acks, "ids": batch}, prepare=prepare)
            done += len(batch)
    return done, time.perf_counter() - started


def main() -> int:
    parser = arguments(__doc__, rounds=3, baseline=True)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--limit", type=int, default=100, help="rows a claim takes")
    parser.add_argument(
        "--every-topic", action="store_true", help="claim as a relay of every topic does"
    )
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        which = "every topic" if args.every_topic else "one topic"
        print(
            f"claim {args.limit} ({which}), ack {IN_FLIGHT} claims behind; "
            f"{args.messages} messages; baseline {args.baseline}"
        )
        for r in range(args.rounds):
            base = drain(url, args.baseline, args.messages, args.limit, args.every_topic)
            cur = drain(url, None, args.messages, args.limit, args.every_topic)
            print(
                f"round {r + 1}: baseline {base:,.0f}/s  current {cur:,.0f}/s ({cur / base:.2f}x)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
