"""Two other places a keyed message's lease could live, measured against the claim as shipped.

A claim of a keyed message costs more than one of an unkeyed message: its
update cannot be HOT (``leased_until`` is in the claim indexes' predicates),
so the row's new version enters the key index too, and its head check probes
that index (BENCHMARKS.md, "Ordering per key"). Two layouts that would avoid
the key index entry, each built in a fresh schema by the migrations and then
changed (neither is a configuration: these are diagnostics for a redesign):

- ``split``: the key index holds only rows no lease holds, and keyed rows in
  flight have an index of their own, ``(topic, key, seq)``, which replaces
  the leased index's entry for them (so a keyed claim writes as many index
  entries as an unkeyed one); the head check probes the ready part, the
  in-flight part and the parked index, and keyed orphans are read from the
  in-flight part. (As written, the head check can miss a head claimed while
  it runs: the common case's cost, not a correct claim.)
- ``hot``: a keyed claim writes its lease to ``lease_ends``, a column no index
  reads, and leaves ``leased_until`` NULL, so its update is HOT (the table at
  ``--fillfactor``, leaving room on each page for a claimed row's new
  version); keyed rows in flight stay in the ready indexes and every claim
  steps over them (a keyed orphan is one whose ``lease_ends`` has passed, found
  in its place). Topic caps and claim runs are not rewritten, and a relay of
  an earlier version would take a keyed row in flight for a ready one.

Reported: the median claim of ``--limit`` (client wall, milliseconds) with
``--in-flight`` earlier claims' rows still held, variant by variant,
alternately in each round. With ``--drains``: instead, one relay draining
``--messages`` unkeyed messages, keyed ones as shipped and keyed ones with the
``hot`` layout (``bench/keys.py``'s drain), messages a second.

    python bench/lease_layouts.py [--database-url URL] [--messages 20000] [--keys 1000]
        [--limit 400] [--in-flight 1] [--fillfactor 50] [--rounds 3] [--drains]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import keys as drains
from keyed_claim import median_claim, statement
from server import local_arguments

VARIANTS = ("unkeyed", "keyed", "split", "hot")

SPLIT = (
    "DROP INDEX outbox_messages_key_idx",
    "DROP INDEX outbox_messages_leased_idx",
    "CREATE INDEX outbox_messages_leased_idx ON outbox_messages (leased_until)"
    " WHERE buried_at IS NULL AND leased_until IS NOT NULL AND key IS NULL",
    "CREATE INDEX outbox_messages_key_ready_idx ON outbox_messages (topic, key, seq)"
    " WHERE key IS NOT NULL AND leased_until IS NULL",
    "CREATE INDEX outbox_messages_key_leased_idx ON outbox_messages (topic, key, seq)"
    " INCLUDE (leased_until)"
    " WHERE key IS NOT NULL AND leased_until IS NOT NULL AND leased_until <> 'infinity'",
)

_NOW = "(SELECT now FROM clock)"
_FREE = f"(lease_ends IS NULL OR lease_ends <= {_NOW})"


def _swap(query: str, old: str, new: str) -> str:
    """``query`` with ``old`` (which must be in it) replaced by ``new``."""
    if old not in query:
        raise SystemExit(f"the claim statement changed: {old[:60]!r} is not in it")
    return query.replace(old, new)


def _cte(query: str, name: str, following: str) -> str:
    """The text of CTE ``name`` in ``query``, up to the CTE ``following``."""
    return query[query.index(f"{name} AS MATERIALIZED (") : query.index(f"{following} AS")]


def split_statement() -> str:
    """message_claim for the ``split`` layout."""
    query = statement("keyed")
    select = (
        "SELECT id, due_at, true AS orphan, lease_solo, octet_length(payload::text) AS size,"
        " topic, key, seq FROM outbox_messages WHERE buried_at IS NULL"
        f" AND leased_until <= {_NOW}"
        " AND (%(topics)s::text IS NULL OR topic IN"
        " (SELECT unnest(string_to_array(%(topics)s::text, ','))))"
    )
    orphans = (
        f"orphans AS MATERIALIZED (SELECT * FROM ({select} AND key IS NULL"
        " ORDER BY due_at, id LIMIT %(limit)s FOR NO KEY UPDATE SKIP LOCKED) AS u"
        f" UNION ALL SELECT * FROM ({select} AND key IS NOT NULL"
        " AND leased_until IS NOT NULL AND leased_until <> 'infinity'"
        " ORDER BY due_at, id LIMIT %(limit)s FOR NO KEY UPDATE SKIP LOCKED) AS k"
        " ORDER BY due_at, id LIMIT %(limit)s),\n"
    )
    query = _swap(query, _cte(query, "orphans", "capped"), orphans)
    probe = (
        "EXISTS (SELECT 1 FROM outbox_messages AS e"
        " WHERE e.topic = c.topic AND e.key = c.key AND e.seq < c.seq AND {} FOR KEY SHARE OF e)"
    )
    ready = (
        "e.leased_until IS NULL AND (e.buried_at IS NULL OR e.topic NOT IN"
        " (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))"
    )
    leased = "e.leased_until IS NOT NULL AND e.leased_until <> 'infinity'"
    parked = "e.leased_until = 'infinity'"
    behind = (
        "behind AS MATERIALIZED (SELECT c.id FROM candidates AS c WHERE c.key IS NOT NULL AND ("
        + " OR ".join(probe.format(p) for p in (ready, leased, parked))
        + ")),\n"
    )
    return _swap(query, _cte(query, "behind", "picked"), behind)


def hot_statement() -> str:
    """message_claim for the ``hot`` layout."""
    query = statement("keyed")
    ready = _cte(query, "ready", "ready_by_topic")
    new = _swap(ready, "false AS orphan", "lease_ends IS NOT NULL AS orphan")
    query = _swap(query, ready, _swap(new, "AND NOT %(solo)s", f"AND NOT %(solo)s AND {_FREE}"))
    by_topic = _cte(query, "ready_by_topic", "orphans")
    new = _swap(by_topic, "false AS orphan", "c.orphan")
    new = _swap(new, "SELECT id, due_at,", "SELECT id, due_at, lease_ends IS NOT NULL AS orphan,")
    query = _swap(
        query, by_topic, _swap(new, "AND topic = k.topic", f"AND topic = k.topic AND {_FREE}")
    )
    return _swap(
        query,
        "ELSE clock.now + %(lease)s END,",
        "WHEN m.key IS NOT NULL THEN NULL ELSE clock.now + %(lease)s END,"
        " lease_ends = CASE WHEN m.key IS NOT NULL AND m.id NOT IN (SELECT id FROM behind)"
        " THEN clock.now + %(lease)s END,",
    )


def hot_schema(fillfactor: int) -> tuple[str, ...]:
    """What turns a migrated schema into the ``hot`` layout."""
    return (
        "ALTER TABLE outbox_messages ADD COLUMN lease_ends timestamptz",
        f"ALTER TABLE outbox_messages SET (fillfactor = {fillfactor})",
    )


async def claims(url: str, variant: str, args: Any) -> float:
    """The median claim of ``variant`` in milliseconds, draining ``args.messages``."""
    spread = [None if variant == "unkeyed" else f"k{i % args.keys}" for i in range(args.messages)]
    async with drains.stored(url, spread, pool_size=1) as store, store.pool.connection() as conn:
        await conn.set_autocommit(True)
        query = {"split": split_statement, "hot": hot_statement}.get(
            variant, lambda: statement(variant)
        )()
        ddl = {"split": SPLIT, "hot": (*hot_schema(args.fillfactor), "VACUUM FULL outbox_messages")}
        for change in ddl.get(variant, ()):
            await conn.execute(change)
        await conn.execute("ANALYZE outbox_messages")
        # The first claims ran with fewer rows in flight.
        return await median_claim(conn, query, args.limit, args.in_flight, skip=args.in_flight)


@contextlib.contextmanager
def hot_layout(fillfactor: int) -> Iterator[None]:
    """Within: the store claims with the ``hot`` layout, and schemas migrate into it."""
    import psycopg

    import outbox.postgres as postgres
    import outbox.postgres.store as store

    migrate, claim = postgres.migrate, store._CLAIM

    async def migrated(conninfo: str, *args: Any, **kwargs: Any) -> Any:
        done = await migrate(conninfo, *args, **kwargs)
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            for change in hot_schema(fillfactor):
                await conn.execute(change)  # type: ignore[arg-type]
        return done

    postgres.migrate, store._CLAIM = migrated, hot_statement()  # type: ignore[assignment]
    try:
        yield
    finally:
        postgres.migrate, store._CLAIM = migrate, claim


def main() -> int:
    parser = local_arguments(__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--in-flight", type=int, default=1, help="earlier claims still held")
    parser.add_argument("--fillfactor", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drains", action="store_true", help="instead: one relay's drains")
    args = parser.parse_args()
    if args.drains:
        plain: list[str | None] = [None] * args.messages
        spread: list[str | None] = [f"k{i % args.keys}" for i in range(args.messages)]
        print("| round | unkeyed | keyed | keyed / unkeyed | keyed, hot | hot / unkeyed |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in range(args.rounds):
            unkeyed = anyio.run(drains.drain, args.database_url, plain)
            keyed = anyio.run(drains.drain, args.database_url, spread)
            with hot_layout(args.fillfactor):
                hot = anyio.run(drains.drain, args.database_url, spread)
            print(
                f"| {r + 1} | {unkeyed:,.0f} | {keyed:,.0f} | {keyed / unkeyed:.2f}x"
                f" | {hot:,.0f} | {hot / unkeyed:.2f}x |",
                flush=True,
            )
        return 0
    if args.limit * (args.in_flight + 1) > args.keys:
        parser.error("--limit times (--in-flight + 1) must not exceed --keys (or claims park)")
    print(f"| round | {' | '.join(VARIANTS)} |")
    print(f"| ---: |{' ---: |' * len(VARIANTS)}")
    for r in range(args.rounds):
        cells = [anyio.run(claims, args.database_url, v, args) for v in VARIANTS]
        print(f"| {r + 1} | {' | '.join(f'{c:.2f} ms' for c in cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
