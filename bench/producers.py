"""The producer's tax: application transactions per second with and without the outbox.

Each client is a thread with its own psycopg connection running, for a fixed
time, the transaction an application runs: insert a business row, plus

- plain: the same message row into a plain table (the same columns, a
  primary key only): what any second insert costs;
- outbox: ``outbox.postgres.add_sync`` inside ``transaction_sync`` (the
  outbox's indexes, and the wake-up after the commit);
- outbox, keyed: the same with a key (1,000 keys): the key's sequence and
  the key index;
- notify inside: the outbox row plus a ``pg_notify`` inside the transaction,
  which is what a trigger-based wake-up does.

At 1, 4 and 8 clients, in a fresh schema. Prints transactions per second and
each variant's share of plain's.

    python -m bench producers [--database-url URL] [--seconds 8] [--fillfactor 100]

``--fillfactor`` sets the outbox table's (a diagnostic: what room left on each
page for a claim's HOT update would cost the producer; see docs/design/ordering.md).

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.server import arguments, postgres
from outbox import new_message
from outbox.postgres import add_sync, migrate, transaction_sync
from outbox.postgres.producer import insert_params

Variant = Callable[[psycopg.Connection[Any], int], None]


def _plain(conn: psycopg.Connection[Any], n: int) -> None:
    m = new_message("orders.placed", {"order": n})
    with conn.transaction():
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        p = insert_params([m])
        conn.execute(
            "INSERT INTO plain_messages (id, topic, payload, created_at, due_at) "
            "VALUES (%s, %s, %s, %s, %s)",
            (p["ids"][0], p["topics"][0], p["payloads"][0], p["created"][0], p["due"][0]),
        )


def _outbox(conn: psycopg.Connection[Any], n: int) -> None:
    with transaction_sync(conn):
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        add_sync(conn, new_message("orders.placed", {"order": n}))


def _outbox_keyed(conn: psycopg.Connection[Any], n: int) -> None:
    with transaction_sync(conn):
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        add_sync(conn, new_message("orders.placed", {"order": n}, key=f"order-{n % 1000}"))


def _notify_inside(conn: psycopg.Connection[Any], n: int) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        add_sync(conn, new_message("orders.placed", {"order": n}))
        conn.execute("SELECT pg_notify('outbox_bench', 'orders.placed')")


VARIANTS: dict[str, Variant] = {
    "plain": _plain,
    "outbox": _outbox,
    "outbox, keyed": _outbox_keyed,
    "notify inside": _notify_inside,
}


def rate(conninfo: str, variant: Variant, clients: int, seconds: float) -> float:
    done = [0] * clients
    start = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        with psycopg.connect(conninfo) as conn:
            for n in range(20):  # warm
                variant(conn, n)
            start.wait()
            deadline = time.monotonic() + seconds
            n = 0
            while time.monotonic() < deadline:
                variant(conn, n)
                n += 1
            done[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.monotonic()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - began)


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--fillfactor", type=int, choices=range(10, 101), metavar="10-100")
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conninfo = make_conninfo(url, options=f"-c search_path={schema}")
        try:
            anyio.run(migrate, conninfo)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, item text)")
                if args.fillfactor:
                    conn.execute(
                        sql.SQL("ALTER TABLE outbox_messages SET (fillfactor = {})").format(
                            sql.Literal(args.fillfactor)
                        )
                    )
                conn.execute(
                    "CREATE TABLE plain_messages (id uuid PRIMARY KEY, topic text NOT NULL, "
                    "payload json NOT NULL, created_at timestamptz NOT NULL, "
                    "due_at timestamptz NOT NULL)"
                )
            print(f"application transactions per second, {args.seconds:.0f} s each")
            for clients in (1, 4, 8):
                rates = {n: rate(conninfo, v, clients, args.seconds) for n, v in VARIANTS.items()}
                plain = rates["plain"]
                print(
                    f"{clients} clients: "
                    + "; ".join(f"{n} {r:,.0f}/s ({r / plain:.2f})" for n, r in rates.items()),
                    flush=True,
                )
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
