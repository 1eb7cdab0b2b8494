"""What ordering per key costs the drain: unkeyed, keyed over many keys, one hot key.

One relay (``Relay.run()``, batch 100, the default interval of 1 s, a no-op
handler) drains, in a fresh schema each, in one run:

- ``--messages`` unkeyed messages;
- the same number with keys, spread over ``--keys`` keys (interleaved, as
  orders arrive);
- ``--hot`` messages of one key.

Reported: messages per second, the keyed drains over the unkeyed one, the
relay's CPU a message (unkeyed / keyed: steadier than the rates on a noisy
machine), and the hot key against the ceiling of any relay that keeps a key's order: one
connection acking a run's messages one at a time (``serial acks``). With
``--statements``, instead: one unkeyed and one keyed drain, with the calls and
wall time of each statement the store ran and the share of the drain spent
in claims (where a drain's time goes). With
``--acks N``: one ack of N claimed messages, unkeyed and keyed, wall and
relay CPU.

    python -m bench keys [--database-url URL] [--messages 20000] [--keys 1000] [--hot 2000]
        [--interval 1s] [--statements | --acks 330]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any

import anyio

from bench.server import arguments

TOPIC = "bench.keys"


@asynccontextmanager
async def stored(
    url: str,
    keys: list[str | None],
    pool_size: int,
    around: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> AsyncIterator[Any]:
    """A PostgresStore on a fresh schema holding one message a key of ``keys``
    (None: unkeyed), in order, each made inside ``around()`` (a producer's span);
    the schema is dropped afterwards."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from outbox import new_message
    from outbox.postgres import PostgresStore, connect_pool, migrate

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    try:
        await migrate(conninfo)
        async with connect_pool(conninfo, max_size=pool_size) as pool:
            store = PostgresStore(pool)

            def made(i: int) -> Any:
                with around():
                    return new_message(TOPIC, {"n": i}, key=keys[i])

            for start in range(0, len(keys), 1000):
                async with store.begin() as tx:
                    await store.add(tx, *map(made, range(start, min(start + 1000, len(keys)))))
            yield store
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


class Counting:
    """A no-op handler that sets ``done`` once it has seen ``n`` messages."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0
        self.done = anyio.Event()

    async def __call__(self, m: Any) -> None:
        self.seen += 1
        if self.seen == self.n:
            self.done.set()


async def left(store: Any) -> int:
    """Messages left in ``store``'s table (for drains whose handlers are the relay's own)."""
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM outbox_messages")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def drain(url: str, keys: list[str | None], interval: str = "1s") -> float:
    """Messages a second of one relay draining ``keys`` (see drained())."""
    return (await drained(url, keys, interval))[0]


async def drained(url: str, keys: list[str | None], interval: str = "1s") -> tuple[float, float]:
    """One relay drains ``keys``: messages a second, and the relay's CPU
    microseconds a message (the process's, from the start to the last handler call)."""
    from prometheus_client import CollectorRegistry

    from outbox import Relay, RelayConfig

    async with stored(url, keys, pool_size=4) as store:
        noop = Counting(len(keys))
        cfg = RelayConfig.model_validate({"batch": 100, "interval": interval})
        relay = Relay(
            store, {TOPIC: noop}, cfg, registry=CollectorRegistry(), listen=False, backlog=None
        )
        started, used = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await noop.done.wait()
            took, cpu = time.perf_counter() - started, time.process_time() - used
            relay.stop()
        return len(keys) / took, cpu / len(keys) * 1e6


async def serial_acks(url: str, n: int) -> float:
    """One connection running a run's ack (message_ack_run_one) for n rows, one
    at a time, as fast as it can: the ceiling of any relay that starts a key's
    next message only once the one before it is acked."""
    from outbox.postgres.queries import QUERIES

    async with stored(url, ["hot"] * n, pool_size=1) as store, store.pool.connection() as conn:
        # Each row's partition of the ring, where there is one (trees before it
        # have no slot, and their statement no such parameter).
        cur = await conn.execute(
            "SELECT id, (to_jsonb(m) ->> 'slot')::int FROM outbox_messages AS m ORDER BY seq"
        )
        rows = await cur.fetchall()
        started = time.perf_counter()
        for message_id, slot in rows:
            await conn.execute(
                QUERIES["message_ack_run_one"], {"id": message_id, "token": None, "slot": slot}
            )
        return n / (time.perf_counter() - started)


def statements(
    url: str, keys: list[str | None], interval: str
) -> tuple[float, dict[str, list[float]]]:
    """Drain ``keys`` as drain() does: the drain's seconds and, per statement of
    the store, the seconds of each call."""
    from outbox.postgres.queries import QUERIES
    from outbox.postgres.statements import Statements
    from outbox.postgres.writes import WriteBacks

    names = {id(q): name for name, q in QUERIES.items()}
    spent: dict[str, list[float]] = {}
    fetch, count = Statements.fetch, Statements.count

    def timed(run: Any) -> Any:
        async def call(self: Statements, query: Any, params: dict[str, Any]) -> Any:
            started = time.perf_counter()
            try:
                return await run(self, query, params)
            finally:
                name = names.get(id(query), str(query)[:40])
                spent.setdefault(name, []).append(time.perf_counter() - started)

        return call

    pipelined = WriteBacks._ack_and_unpark

    async def ack_and_unpark(self: WriteBacks, params: Any) -> Any:
        started = time.perf_counter()
        try:
            return await pipelined(self, params)
        finally:
            name = "message_ack_keyed + key_unpark"
            spent.setdefault(name, []).append(time.perf_counter() - started)

    Statements.fetch, Statements.count = timed(fetch), timed(count)  # type: ignore[method-assign]
    WriteBacks._ack_and_unpark = ack_and_unpark  # type: ignore[method-assign]
    try:
        rate = anyio.run(drain, url, keys, interval)
    finally:
        Statements.fetch, Statements.count = fetch, count  # type: ignore[method-assign]
        WriteBacks._ack_and_unpark = pipelined  # type: ignore[method-assign]
    return len(keys) / rate, spent


ACK_WAYS = ("unkeyed", "keyed")


async def acks(url: str, n: int, rounds: int = 30) -> dict[str, tuple[float, float]]:
    """One ack of ``n`` claimed messages (of ``n`` keys), each way of ACK_WAYS:
    wall and relay CPU milliseconds an ack, the mean of ``rounds``."""
    import datetime as dt

    lease = dt.timedelta(seconds=30)
    took: dict[str, tuple[float, float]] = {}
    for way in ACK_WAYS:
        keys = [None if way == "unkeyed" else f"k{i % n}" for i in range(n * rounds)]
        async with stored(url, keys, pool_size=2) as store:
            wall = cpu = 0.0
            for _ in range(rounds):
                got = await store.claim(None, lease, n)
                ids, tokens = [m.id for m in got], {m.lease for m in got}
                started, used = time.perf_counter(), time.process_time()
                if way == "unkeyed":
                    await store.ack_many(ids, keyed=False)
                else:  # fenced by the lease, unparking in the same round trip
                    await store.ack_many(ids, tokens=tokens)
                wall += time.perf_counter() - started
                cpu += time.process_time() - used
        took[way] = (wall / rounds * 1000, cpu / rounds * 1000)
    return took


def main() -> int:
    parser = arguments(__doc__, rounds=3, local=True)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--hot", type=int, default=2_000)
    parser.add_argument(
        "--interval",
        default="1s",
        help="the relay's OUTBOX_INTERVAL: how often an idle relay polls (and housekeeps)",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="where a drain's time goes, statement by statement",
    )
    parser.add_argument(
        "--acks",
        type=int,
        metavar="N",
        help="instead: one ack of N claimed messages, unkeyed and keyed, what it costs",
    )
    args = parser.parse_args()
    n = args.messages
    plain_keys: list[str | None] = [None] * n
    spread_keys: list[str | None] = [f"k{i % args.keys}" for i in range(n)]
    hot_keys: list[str | None] = ["hot"] * args.hot
    if args.acks:
        print(f"| round | {' | '.join(ACK_WAYS)} |")
        print(f"| ---: |{' ---: |' * len(ACK_WAYS)}")
        for r in range(args.rounds):
            took = anyio.run(acks, args.database_url, args.acks)
            cells = " | ".join(f"{wall:.2f} ms ({cpu:.2f} CPU)" for wall, cpu in took.values())
            print(f"| {r + 1} | {cells} |", flush=True)
        return 0
    if args.statements:
        for label, keys in (("unkeyed", plain_keys), ("keyed", spread_keys)):
            wall, spent = statements(args.database_url, keys, args.interval)
            claims = sum(sum(spent.get(q, ())) for q in ("message_claim", "message_claim_run"))
            print(
                f"{label}: drain {wall * 1000:.0f} ms, {claims / wall:.0%} of it in claims;"
                " statement, calls, ms each (mean, median)"
            )
            for name, each in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
                mean, median = sum(each) / len(each), statistics.median(each)
                print(f"  {name} {len(each)} {mean * 1000:.1f} {median * 1000:.1f}")
        return 0
    print(
        f"| round | unkeyed | keyed, {args.keys} keys | keyed / unkeyed | relay CPU a message"
        f" | one hot key ({args.hot}) | serial acks | hot / serial acks |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in range(args.rounds):
        plain, plain_cpu = anyio.run(drained, args.database_url, plain_keys, args.interval)
        spread, spread_cpu = anyio.run(drained, args.database_url, spread_keys, args.interval)
        hot = anyio.run(drain, args.database_url, hot_keys, args.interval)
        ceiling = anyio.run(serial_acks, args.database_url, args.hot)
        print(
            f"| {r + 1} | {plain:,.0f} | {spread:,.0f} | {spread / plain:.2f}x"
            f" | {plain_cpu:.1f} / {spread_cpu:.1f} µs | {hot:,.0f}"
            f" | {ceiling:,.0f} | {hot / ceiling:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
