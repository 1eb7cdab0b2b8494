"""The drain through each broker kind against its local broker, beside a no-op handler.

Each round fills a fresh schema with ``--messages`` messages and drains them
with one relay (``Relay.run()``, batch 100) whose topic is bound, through the
topic registry, to: the no-op handler (the ceiling), the amqp kind (RabbitMQ on
127.0.0.1:5672, a durable topic exchange with one queue, confirms on), the
redis kind (XADD to the Redis on 127.0.0.1:6379) and the nats kind (a
JetStream stream on a nats-server the run starts). Reported: messages per
second, and each kind over the no-op drain of the same round.

    python -m bench kinds [--database-url URL] [--messages 5000] [--rounds 3]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from bench.keys import TOPIC, Counting, left, stored
from bench.server import arguments, listening

AMQP = "amqp://127.0.0.1:5672/"
REDIS = "redis://127.0.0.1:6379/0"
NAME = f"outbox-bench-{uuid.uuid4().hex[:6]}"


async def drain(url: str, n: int, kind: str | None, nats_url: str) -> float:
    """Messages per second of one drain through ``kind`` (None: a no-op handler)."""
    from prometheus_client import CollectorRegistry

    from outbox import Relay, RelayConfig
    from outbox.handlers import HandlerKinds
    from outbox.handlers.settings import AmqpSettings, NatsSettings, RedisSettings
    from outbox.store import TopicSettings

    async with stored(url, [None] * n, pool_size=4) as store:
        count = Counting(n)
        kinds = HandlerKinds(
            amqp=AmqpSettings(url=AMQP),
            redis=RedisSettings(url=REDIS),
            nats=NatsSettings(url=nats_url),
        )
        handlers: dict[str, Any] = {}
        if kind is None:
            handlers = {TOPIC: count}
        else:
            config = {
                "amqp": {"exchange": NAME, "routingKey": "orders.placed"},
                "redis": {"stream": NAME, "maxLen": 100_000},
                "nats": {"subject": "bench.orders"},
            }[kind]
            await store.set_topic(TopicSettings(TOPIC, handler=kind, config=config))
        relay = Relay(
            store,
            handlers,
            RelayConfig.model_validate({"batch": 100, "interval": "100ms"}),
            registry=CollectorRegistry(),
            kinds=kinds.mapping,
            listen=False,
            backlog=None,
        )
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            if kind is None:
                await count.done.wait()
            else:  # the kinds' handlers are the relay's own: wait for an empty table
                while await left(store):  # noqa: ASYNC110 (a table, not an event)
                    await anyio.sleep(0.02)
            took = time.perf_counter() - started
            relay.stop()
        await kinds.aclose()
        return n / took


async def _brokers(nats_url: str) -> None:
    import aio_pika
    import nats

    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(NAME, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(NAME, durable=True, arguments={"x-max-length": 100_000})
    await queue.bind(exchange, "#")
    await connection.close()
    nc = await nats.connect(nats_url)
    await nc.jetstream().add_stream(name="BENCH", subjects=["bench.>"], max_msgs=100_000)
    await nc.close()


async def _clean() -> None:
    import aio_pika
    import redis.asyncio

    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel()
    await channel.queue_delete(NAME)
    await channel.exchange_delete(NAME)
    await connection.close()
    client = redis.asyncio.Redis.from_url(REDIS)
    await client.delete(NAME)
    await client.aclose()


def _nats_server(folder: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = Path(sys.executable).parent / "nats-server"
    proc = subprocess.Popen(
        [str(binary), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listening(port)
    return proc, f"nats://127.0.0.1:{port}"


def main() -> int:
    parser = arguments(__doc__, rounds=3, local=True)
    parser.add_argument("--messages", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        proc, nats_url = _nats_server(folder)
        try:
            anyio.run(_brokers, nats_url)
            print("| round | no-op | amqp | redis | nats |")
            print("| ---: | ---: | ---: | ---: | ---: |")
            for r in range(args.rounds):
                got = {
                    kind: anyio.run(drain, args.database_url, args.messages, kind, nats_url)
                    for kind in (None, "amqp", "redis", "nats")
                }
                plain = got[None]
                cells = [
                    f"{got[k]:,.0f} ({got[k] / plain:.2f}x)" for k in ("amqp", "redis", "nats")
                ]
                print(f"| {r + 1} | {plain:,.0f} | {' | '.join(cells)} |", flush=True)
        finally:
            anyio.run(_clean)
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
