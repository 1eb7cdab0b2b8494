"""What a ring of partitions would cost the claim and the ack, before it is built.

A candidate layout for storage under a held snapshot (docs/design/held-snapshots.md):
``outbox_messages`` partitioned by a ``slot`` that an insert takes from the
database's clock, ``--slots`` ring partitions (each with only the indexes a
claim and an ack use) and the table as it was as the long-stay partition.
The same drain as ``claim_statement`` (claim 100 of one topic, ack four
claims behind, 50,000 messages, statements unprepared, as relays run them)
runs in one run, round by round, on:

- ``table``: the tree's schema and its whole claim statement (what a relay
  with capped topics runs);
- ``lean``: the tree's schema, with the form of the claim a relay of one
  topic and no caps runs (``claims.without``: no ``ready`` and ``capped``
  reads for the planner to plan);
- ``ring``: the candidate layout, with the tree's statements on the parent
  (every partition planned and probed);
- ``pruned``: the candidate layout with the lean claim, each of its reads and
  writes (the head check of keyed messages too) and each ack limited to the
  ring slots that hold messages (``slot = ANY(...)``: pruned when planned),
  the long-stay partition left out: the best the layout allows.

Reported: messages per second, and each candidate against ``table``; with
``--plan``, the claim's planning and execution times instead (median of 40).

    python -m bench ring_layout [--database-url URL] [--slots 3] [--rounds 3] [--messages 50000]
        [--plan]
"""

from __future__ import annotations

import re
import statistics
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.claim_statement import IN_FLIGHT, claim_and_ack, migrated_at
from bench.server import arguments, postgres
from outbox.postgres.claims import without
from outbox.postgres.queries import QUERIES

RING = (Path(__file__).parent / "ring_layout.sql").read_text()
_SLOTS = "slot = ANY(%(slots)s::smallint[]) AND "


def pruned(query: str) -> str:
    """``query`` with every read, the head check's too, and its write limited to slots."""
    out = re.sub(r"FROM outbox_messages\s+WHERE ", "FROM outbox_messages WHERE " + _SLOTS, query)
    out = out.replace(
        "FROM outbox_messages AS e\nWHERE ", "FROM outbox_messages AS e\nWHERE e." + _SLOTS
    )
    out = out.replace("WHERE m.id = ANY(", "WHERE m." + _SLOTS + "m.id = ANY(")
    return out.replace(
        "DELETE FROM outbox_messages WHERE id", "DELETE FROM outbox_messages WHERE " + _SLOTS + "id"
    )


@contextmanager
def layout(url: str, name: str, slots: int, messages: int) -> Iterator[psycopg.Connection[Any]]:
    with migrated_at(url, None) as conn:
        if name in ("ring", "pruned"):
            conn.execute(
                RING.replace("{slots}", str(slots)).replace("{last}", str(slots - 1)).encode()
            )
        conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at) "
            "SELECT gen_random_uuid(), 'orders.placed', '{}', t, t "
            "FROM (SELECT now() - interval '1 hour' + i * interval '1 ms' AS t "
            "      FROM generate_series(1, %s) AS i) AS s",
            (messages,),
        )
        conn.execute("VACUUM ANALYZE outbox_messages")
        yield conn


def statements(name: str) -> tuple[bytes, bytes]:
    claim, ack = QUERIES["message_claim"], QUERIES["message_ack_unkeyed"]
    if name == "lean":
        claim = without(claim, "ready", "capped")
    if name == "pruned":
        claim, ack = pruned(without(claim, "ready", "capped")), pruned(ack)
    return claim.encode(), ack.encode()


def params(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    (filled,) = conn.execute(
        "SELECT coalesce(array_agg(DISTINCT slot), '{}') FROM outbox_messages"
        if "slot" in _columns(conn)
        else "SELECT '{}'::smallint[]"
    ).fetchone() or ([],)
    return {
        "now": None, "lease": "2 min", "limit": 100, "topics": "orders.placed",
        "capped": [], "caps": [], "isolate": True, "solo": False,
        "max_bytes": 32 * 1024 * 1024, "by_topic": True, "after": None,
        "slots": sorted(filled),
    }  # fmt: skip


def _columns(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'outbox_messages'::regclass"
    ).fetchall()
    return {r[0] for r in rows}


def drain(url: str, name: str, slots: int, messages: int) -> float:
    with layout(url, name, slots, messages) as conn:
        claim, ack = statements(name)
        p = params(conn)
        done, elapsed = claim_and_ack(conn, claim, ack, p, {"slots": p["slots"]}, prepare=False)
    assert done == messages, f"{done} of {messages} acked"
    return messages / elapsed


def plan(url: str, name: str, slots: int, messages: int) -> tuple[float, float]:
    with layout(url, name, slots, messages) as conn:
        claim, _ = statements(name)
        p = params(conn)
        planning, execution = [], []
        for _ in range(40):
            (out,) = conn.execute(
                b"EXPLAIN (ANALYZE, SUMMARY, FORMAT JSON) " + claim,
                {**p, "token": uuid.uuid4()},
                prepare=False,
            ).fetchone() or (None,)
            planning.append(out[0]["Planning Time"])
            execution.append(out[0]["Execution Time"])
    return statistics.median(planning), statistics.median(execution)


def main() -> int:
    parser = arguments(__doc__, rounds=3)
    parser.add_argument("--slots", type=int, default=3, help="ring partitions")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--plan", action="store_true", help="the claim's planning time")
    args = parser.parse_args()
    names = ("table", "lean", "ring", "pruned")
    with postgres(args.database_url) as url:
        print(f"{args.messages} messages; claim 100 of one topic, ack {IN_FLIGHT} behind; "
              f"a ring of {args.slots} slots and the long-stay partition")  # fmt: skip
        for r in range(args.rounds):
            if args.plan:
                got = {n: plan(url, n, args.slots, args.messages) for n in names}
                print(f"round {r + 1}: " + "; ".join(
                    f"{n} planning {p:.3f} ms, execution {e:.3f} ms" for n, (p, e) in got.items()
                ), flush=True)  # fmt: skip
                continue
            rates = {n: drain(url, n, args.slots, args.messages) for n in names}
            base = rates["table"]
            print(f"round {r + 1}: " + "; ".join(
                f"{n} {v:,.0f}/s ({v / base:.2f}x)" for n, v in rates.items()
            ), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
