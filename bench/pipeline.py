"""The relay's pipeline side by side with an earlier version and the reference relay.

Each scenario runs every system in its own fresh schema on one PostgreSQL, in
the same run, so the figures compare (this machine is noisy: read ratios):

- drain: N no-op messages at batch 100, one relay process, ``Relay.run()``
  from start until the last ack; the reference relay drains its own table.
- slow: 1 % of handlers sleep 5 s (a slow SMTP server), batch 100,
  OUTBOX_CONCURRENCY 100; messages delivered in a fixed window, and for the
  fast ones the time from the handler's return to the ack's commit (an AFTER
  DELETE trigger stamps it with clock_timestamp()).
- hanging: three healthy topics alone, then with a fourth whose handler
  hangs until its 2 s timeout (maxInFlight 4 where the version has it); the
  healthy topics' throughput in both.

    python -m bench pipeline [--database-url URL] [--baseline REF] [--messages N]

The baseline (default: the last commit before the pipeline) is exported from
git into a temporary folder and imported from there in its own processes.
Without --database-url (or OUTBOX_BENCH_DATABASE_URL) an embedded PostgreSQL
is started. Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.reference import drain
from bench.server import arguments, postgres

REPO = Path(__file__).resolve().parents[1]
BASELINE = "eeecbe5"
SLOW_SECONDS = 5.0
WINDOW = 20.0


# -- one system, in its own process -------------------------------------------------


def worker(scenario: str, url: str, n: int) -> dict[str, Any]:
    """Run ``scenario`` with whichever ``outbox`` is importable; return its figures."""
    import anyio

    return anyio.run(_worker, scenario, url, n)


async def _worker(scenario: str, url: str, n: int) -> dict[str, Any]:
    import datetime as dt

    import anyio
    import psycopg
    from prometheus_client import CollectorRegistry
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from outbox import Message, Relay, RelayConfig, new_message
    from outbox.postgres import PostgresStore, connect_pool, migrate
    from outbox.store import TopicSettings

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    await migrate(conninfo)

    def prefill(topics: list[tuple[str, dict[str, Any]]]) -> None:
        with (
            psycopg.connect(conninfo) as conn,
            conn.cursor() as cur,
            cur.copy(
                "COPY outbox_messages (id, topic, payload, created_at, due_at) FROM STDIN"
            ) as copy,
        ):
            for i, (topic, payload) in enumerate(topics):
                m = new_message(topic, payload, t0 + dt.timedelta(microseconds=i))
                copy.write_row((m.id, m.topic, m.payload.decode(), m.created_at, m.created_at))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox_messages")

    returned: dict[uuid.UUID, float] = {}
    delivered: dict[str, int] = {}
    done = anyio.Event()
    target = {"count": n}

    async def noop(m: Message) -> None:
        delivered[m.topic] = delivered.get(m.topic, 0) + 1
        if sum(delivered.values()) >= target["count"]:
            done.set()

    async def maybe_slow(m: Message) -> None:
        if m.payload.startswith(b'{"slow":true'):
            await anyio.sleep(SLOW_SECONDS)
        else:
            returned[m.id] = time.time()
        delivered["all"] = delivered.get("all", 0) + 1

    async def healthy(m: Message) -> None:
        delivered["healthy"] = delivered.get("healthy", 0) + 1
        if delivered["healthy"] >= target["count"]:
            done.set()

    async def hang(m: Message) -> None:
        await anyio.sleep_forever()

    async def run(relay: Any, until: Any) -> float:
        async with anyio.create_task_group() as tg:
            started = time.perf_counter()
            tg.start_soon(relay.run)
            await until()
            took = time.perf_counter() - started
            relay.stop()
        return took

    try:
        async with connect_pool(conninfo, min_size=2, max_size=4) as pool:
            store = PostgresStore(pool)
            out: dict[str, Any] = {}
            # The delivery loop alone, as the reference relay is: a release whose
            # run() also listens and counts the backlog has them turned off.
            takes = inspect.signature(Relay).parameters
            loop_only: dict[str, Any] = (
                {"listen": False, "backlog": None} if "backlog" in takes else {}
            )
            if scenario == "drain":
                prefill([("bench.noop", {"n": i, "to": "x@example.com"}) for i in range(n)])
                cfg = RelayConfig.model_validate({"batch": 100, "interval": "10ms"})
                relay = Relay(
                    store, {"bench.noop": noop}, cfg, registry=CollectorRegistry(), **loop_only
                )
                cpu = time.process_time()
                took = await run(relay, done.wait)
                out = {"msg_s": n / took, "cpu_us": (time.process_time() - cpu) / n * 1e6}
            elif scenario == "slow":
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(ACK_TRIGGER)
                prefill([("bench.mail", {"slow": i % 100 == 50, "n": i}) for i in range(n)])
                cfg = RelayConfig.model_validate(
                    {"batch": 100, "concurrency": 100, "timeout": "30s", "interval": "10ms"}
                )
                relay = Relay(store, {"bench.mail": maybe_slow}, cfg, registry=CollectorRegistry())
                took = await run(relay, lambda: anyio.sleep(WINDOW))
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    acked = dict(conn.execute("SELECT id, extract(epoch FROM at) FROM bench_acks"))
                waits = sorted(
                    (float(acked[i]) - t) * 1000 for i, t in returned.items() if i in acked
                )
                out = {
                    "msg_s": delivered.get("all", 0) / took,
                    "ack_p50_ms": statistics.median(waits) if waits else None,
                    "ack_p99_ms": waits[int(len(waits) * 0.99)] if waits else None,
                }
            elif scenario.startswith("healthy-"):
                rows = []
                hanging = scenario != "healthy-alone"
                for i in range(n):
                    rows.append((f"bench.healthy{i % 3}", {"n": i}))
                    if hanging and i % 20 == 0:
                        rows.append(("bench.stuck", {"n": i}))
                prefill(rows)
                capped = scenario == "healthy-with-hanging"
                if capped and "max_in_flight" in TopicSettings.__dataclass_fields__:
                    await store.set_topic(TopicSettings("bench.stuck", max_in_flight=4), t0)
                cfg = RelayConfig.model_validate(
                    {"batch": 100, "timeout": "2s", "lease": "10s", "interval": "10ms"}
                )
                handlers = {f"bench.healthy{k}": healthy for k in range(3)}
                handlers["bench.stuck"] = hang
                relay = Relay(store, handlers, cfg, registry=CollectorRegistry())
                took = await run(relay, lambda: _within(done, 30))
                out = {"msg_s": delivered.get("healthy", 0) / took}
            return out
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


async def _within(event: Any, seconds: float) -> None:
    import anyio

    with anyio.move_on_after(seconds):
        await event.wait()


ACK_TRIGGER = """
CREATE TABLE bench_acks (id uuid, at timestamptz);
CREATE FUNCTION bench_ack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_acks VALUES (OLD.id, clock_timestamp());
    RETURN OLD;
END $$;
CREATE TRIGGER bench_ack AFTER DELETE ON outbox_messages
    FOR EACH ROW EXECUTE FUNCTION bench_ack();
"""


# -- the comparison ------------------------------------------------------------------


def export(ref: str, into: Path) -> Path:
    """``ref``'s src/ folder, exported from git into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "src"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_system(src: Path, scenario: str, url: str, n: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.pipeline",
            "--worker",
            scenario,
            "--database-url",
            url,
            "--messages",
            str(n),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{scenario} failed:\n{result.stderr}")
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def reference(url: str, n: int, workers: int = 1) -> float:
    """The reference relay's drain of ``n`` messages (bench.reference), msg/s."""
    return drain(url, n, 100, workers)


def compare(url: str, baseline: str, n: int, rounds: int, drain_only: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="outbox-baseline-") as tmp:
        systems = {"baseline": export(baseline, Path(tmp)), "current": REPO / "src"}
        print(f"baseline {baseline}; current: the working tree; {n} messages")
        for r in range(rounds):
            # Each goes first in every other round: what runs second pays for
            # what the first left behind (dead rows, the checkpoint).
            order = list(systems.items())[:: 1 if r % 2 == 0 else -1]
            got = {name: run_system(src, "drain", url, n) for name, src in order}
            ref = reference(url, n)
            base, cur = got["baseline"]["msg_s"], got["current"]["msg_s"]
            cpu = {k: f"{v['cpu_us']:.1f}" if "cpu_us" in v else "?" for k, v in got.items()}
            print(
                f"drain, batch 100, 1 process (round {r + 1}): baseline {base:,.0f}"
                f"  current {cur:,.0f} ({cur / base:.2f}x)"
                f"  reference {ref:,.0f} (current/reference {cur / ref:.2f});"
                f" relay CPU µs/msg baseline {cpu['baseline']} current {cpu['current']}",
                flush=True,
            )
        if drain_only:
            return
        slow_n = 60_000
        for name, src in systems.items():
            got = run_system(src, "slow", url, slow_n)
            p50 = got["ack_p50_ms"]
            p99 = got["ack_p99_ms"]
            print(
                f"1% of handlers sleep {SLOW_SECONDS:.0f}s, concurrency 100, {WINDOW:.0f}s window: "
                f"{name} {got['msg_s']:,.1f} msg/s, fast acks p50 "
                f"{p50 if p50 is None else round(p50, 2)} ms, p99 "
                f"{p99 if p99 is None else round(p99, 2)} ms",
                flush=True,
            )
        healthy_n = max(n // 2, 3000)
        for name, src in systems.items():
            alone = run_system(src, "healthy-alone", url, healthy_n)["msg_s"]
            mixed = run_system(src, "healthy-with-hanging", url, healthy_n)["msg_s"]
            print(
                f"healthy topics alone {alone:,.0f} msg/s, beside a hanging topic {mixed:,.0f}"
                f" msg/s ({mixed / alone:.0%}): {name}",
                flush=True,
            )
        uncapped = run_system(systems["current"], "healthy-with-hanging-uncapped", url, healthy_n)
        print(
            f"healthy topics beside a hanging topic without maxInFlight: current "
            f"{uncapped['msg_s']:,.0f} msg/s",
            flush=True,
        )


def main() -> int:
    parser = arguments(__doc__, rounds=2, baseline=True)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--drain-only", action="store_true", help="only the drain rounds")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.database_url, args.messages)))
        return 0

    with postgres(args.database_url) as url:
        compare(url, args.baseline, args.messages, args.rounds, args.drain_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
