"""One claim's latency beside a paused backlog and with a large topic registry.

The working tree's claim statement against an earlier commit's. Each case gets
a fresh schema built by that side's own migrations and 1,000 due messages of
the topics the relay serves, and each claim takes 10 of them (with the
parameters the store passes) and is rolled back, so every claim sees the same
table. Cases:

- one topic served, no other backlog (the reference for the next two);
- one topic served, a paused topic's backlog of --paused messages due first;
- a registry of --topics topics, all served, the 1,000 messages spread over them.

Prints the median and p95 of --claims claims per case.

    python -m bench claim_latency [--database-url URL] [--baseline REF]

Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

from bench.claim_statement import _queries, migrated_at, topics_param
from bench.server import arguments, postgres
from outbox.postgres.claims import EVERY_SLOT

SERVED, PAUSED = "orders.placed", "billing.invoice"
BY_TOPIC = 32  # outbox.postgres.store.BY_TOPIC; earlier commits ignore the parameter

FILL = (
    "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at) "
    "SELECT gen_random_uuid(), {topic}, '{{}}', t, t "
    "FROM (SELECT now() - %s::interval + i * interval '1 ms' AS t, i "
    "      FROM generate_series(1, %s) AS i) AS s"
)


def latencies(url: str, rev: str | None, *, paused: int, topics: int, claims: int) -> list[float]:
    with migrated_at(url, rev) as conn:
        conn.execute(FILL.format(topic="%s"), (PAUSED, "2 hours", paused))
        if topics == 1:
            served = [SERVED]
            conn.execute(FILL.format(topic="%s"), (SERVED, "1 hour", 1000))
        else:
            served = [f"registry.{i}" for i in range(topics)]
            spread = FILL.format(topic=f"'registry.' || (i %% {topics})")
            conn.execute(spread, ("1 hour", 1000))
        conn.execute("VACUUM ANALYZE outbox_messages")
        claim = _queries(rev)["message_claim"].encode()
        params = {
            "now": None,
            "lease": "2 min",
            "limit": 10,
            "token": uuid.uuid4(),
            "topics": topics_param(claim, served),
            "capped": [],
            "caps": [],
            "isolate": True,
            "solo": False,
            "max_bytes": 32 * 1024 * 1024,  # what relays pass (earlier commits ignore it)
            "by_topic": len(served) <= BY_TOPIC,
            "a": "-infinity",  # no watermark (earlier commits ignore it)
            "slots": list(EVERY_SLOT),  # every partition of the ring (earlier commits ignore it)
        }
        took = []
        for _ in range(claims):
            with conn.transaction(force_rollback=True):
                started = time.perf_counter()
                rows = conn.execute(claim, params).fetchall()
                took.append((time.perf_counter() - started) * 1000)
                assert len(rows) == 10, rows
    return took


def main() -> int:
    parser = arguments(__doc__, baseline=True)
    parser.add_argument("--paused", type=int, default=200_000)
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()
    with postgres(args.database_url) as url:
        print(f"one claim of 10; {args.claims} claims each; baseline {args.baseline}")
        cases = (
            ("1 topic", {"paused": 0, "topics": 1}),
            (f"1 topic, paused {args.paused:,}", {"paused": args.paused, "topics": 1}),
            (f"{args.topics:,} topics", {"paused": 0, "topics": args.topics}),
        )
        for name, rev in (("baseline", args.baseline), ("current", None)):
            row = []
            for case, kwargs in cases:
                took = latencies(url, rev, claims=args.claims, **kwargs)
                p95 = statistics.quantiles(took, n=20)[18]
                row.append(f"{case}: p50 {statistics.median(took):.2f} ms, p95 {p95:.2f}")
            print(f"{name:>8}: " + "; ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
