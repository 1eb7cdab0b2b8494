"""Where a keyed claim's time goes: the claim statement alone, keyed against unkeyed.

Each variant gets a fresh schema built by the migrations, ``--messages`` due
messages (keyed ones spread over ``--keys`` keys, interleaved, as orders
arrive) and a loop that claims ``--limit`` with the previous claim's rows still
in flight (as a relay holds them; fewer than the keys, so nothing is parked),
acks them with a plain DELETE, and claims again until the table is empty.
Reported: the median claim (client wall, milliseconds), variant by variant,
alternately in each round:

- ``unkeyed``: the claim as shipped, messages without keys;
- ``keyed``: the claim as shipped, keyed messages;
- ``keyed, no head check``: the same without the ``behind`` step (what the
  head check's probe of the key index costs);
- ``keyed, no head check, no key index``: also without
  outbox_messages_key_idx (what the key index entry of each claimed row's
  new version costs: a claim's update cannot be HOT);
- ``keyed, hashed key index``: the key index on ``(hashtextextended(key,
  hashtext(topic)), seq)`` in place of ``(topic, key, seq)`` (eight bytes an
  entry whatever the key's length), the head check probing it and comparing
  topic and key in the row.

The last two are diagnostics, not configurations: without the head check a
key's order is not kept.

    python bench/keyed_claim.py [--database-url URL] [--messages 20000] [--keys 1000]
        [--limit 400] [--rounds 3]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keys import stored
from server import local_arguments

VARIANTS = (
    "unkeyed",
    "keyed",
    "keyed, no head check",
    "keyed, no head check, no key index",
    "keyed, hashed key index",
)

_HASH = "hashtextextended({0}key, hashtext({0}topic))"
_BY_KEY = "WHERE e.topic = c.topic AND e.key = c.key AND e.seq < c.seq"


def statement(variant: str) -> str:
    """message_claim as ``variant`` runs it."""
    from outbox.postgres.queries import QUERIES

    claim: str = QUERIES["message_claim"]
    if "no head check" in variant:
        start, end = claim.index("behind AS MATERIALIZED ("), claim.index("picked AS MATERIALIZED")
        claim = (
            claim[:start]
            + "behind AS MATERIALIZED (SELECT id FROM candidates WHERE false),\n"
            + claim[end:]
        )
    if "hashed" in variant:
        hashed = f"WHERE {_HASH.format('e.')} = {_HASH.format('c.')} AND e.seq < c.seq"
        if _BY_KEY not in claim:
            raise SystemExit("message_claim's head check changed: update keyed_claim.py")
        claim = claim.replace(_BY_KEY, f"{hashed} AND e.topic = c.topic AND e.key = c.key")
    return claim


async def median_claim(
    conn: Any, query: str, limit: int, in_flight: int = 1, skip: int = 0
) -> float:
    """Claim ``limit`` with ``query`` on ``conn`` until the table is empty, the
    ``in_flight`` claims before each still held (the oldest is acked with a
    plain DELETE once more are held): the median claim in milliseconds, less
    the first ``skip`` claims."""
    from outbox.postgres.store import claim_params

    took: list[float] = []
    held: list[list[Any]] = []
    while True:
        params = claim_params(None, dt.timedelta(seconds=30), limit, uuid.uuid4())
        started = time.perf_counter()
        cur = await conn.execute(query, params)
        rows = await cur.fetchall()
        took.append(time.perf_counter() - started)
        ids = [r[0] for r in rows if r[0] is not None]
        if not ids:
            return statistics.median(took[skip:]) * 1000
        held.append(ids)
        if len(held) > in_flight:
            await conn.execute("DELETE FROM outbox_messages WHERE id = ANY(%s)", [held.pop(0)])


async def claims(url: str, variant: str, messages: int, keys: int, limit: int) -> float:
    """The median claim of ``variant`` in milliseconds, draining ``messages``."""
    spread = [None if variant == "unkeyed" else f"k{i % keys}" for i in range(messages)]
    async with stored(url, spread, pool_size=1) as store, store.pool.connection() as conn:
        await conn.set_autocommit(True)
        if variant.endswith("no key index"):
            await conn.execute("DROP INDEX outbox_messages_key_idx")
        if "hashed" in variant:
            await conn.execute("DROP INDEX outbox_messages_key_idx")
            await conn.execute(
                "CREATE INDEX outbox_messages_key_idx ON outbox_messages"
                f" ({_HASH.format('')}, seq) WHERE key IS NOT NULL"
            )
        await conn.execute("ANALYZE outbox_messages")
        return await median_claim(conn, statement(variant), limit)


def main() -> int:
    parser = local_arguments(__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.limit >= args.keys // 2:
        parser.error("--limit must be under half of --keys (two claims in flight park nothing)")
    print(f"| round | {' | '.join(VARIANTS)} |")
    print(f"| ---: |{' ---: |' * len(VARIANTS)}")
    for r in range(args.rounds):
        cells = [
            anyio.run(claims, args.database_url, v, args.messages, args.keys, args.limit)
            for v in VARIANTS
        ]
        print(f"| {r + 1} | {' | '.join(f'{c:.2f} ms' for c in cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
