"""A short tour on the embedded default: add messages with a change, relay them.

Run with ``python -m outbox.demo`` (or ``make demo``). It starts a real
PostgreSQL under ./.outbox, creates an orders table beside the outbox, places
a few orders (each order and its message in one transaction; one transaction
rolls back), relays the messages to a handler that fails once, and prints what
happened. It leaves nothing running.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, new_message, system_clock
from outbox.embedded import EmbeddedPostgres
from outbox.postgres import PostgresStore, connect_pool, migrate

__all__ = ["main"]

TOPIC = "orders.placed"


async def _tour(url: str) -> dict[str, Any]:
    await migrate(url)
    async with connect_pool(url) as pool:
        store = PostgresStore(pool)
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS demo_orders (id serial PRIMARY KEY, item text)"
            )
            await conn.execute("TRUNCATE demo_orders")

        added = 0
        for item in ("tea", "coffee", "cocoa"):
            async with store.begin() as conn:
                await conn.execute("INSERT INTO demo_orders (item) VALUES (%s)", (item,))
                await store.add(conn, new_message(TOPIC, {"item": item}, system_clock()))
                added += 1
        try:
            async with store.begin() as conn:
                await conn.execute("INSERT INTO demo_orders (item) VALUES ('ghost')")
                await store.add(conn, new_message(TOPIC, {"item": "ghost"}, system_clock()))
                raise RuntimeError("payment declined")
        except RuntimeError:
            pass  # the order and its message rolled back together

        delivered: list[str] = []
        failed_once: set[str] = set()
        all_delivered = anyio.Event()

        async def ship(m: Message) -> None:
            item = m.json()["item"]
            if item == "coffee" and item not in failed_once:
                failed_once.add(item)
                raise ConnectionError("warehouse API unavailable")
            delivered.append(f"{item} (attempt {m.attempts})")
            if len(delivered) == added:
                all_delivered.set()

        registry = CollectorRegistry()
        relay = Relay(
            store,
            {TOPIC: ship},
            RelayConfig.model_validate({"interval": "100ms"}),
            registry=registry,
        )
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run)
                await all_delivered.wait()
                relay.stop()  # returns once the batch in hand is acked
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM demo_orders")
            orders = (await cur.fetchone() or [0])[0]

        def total(name: str) -> int:
            return int(registry.get_sample_value(name, {"topic": TOPIC}) or 0)

        return {
            "orders committed": orders,
            "messages added": added,
            "delivered": total("outbox_delivered_total"),
            "retried": total("outbox_retried_total"),
            "buried": total("outbox_buried_total"),
            "deliveries": delivered,
        }


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="  log: %(levelname)s %(message)s")
    data_dir = os.environ.get("OUTBOX_DATA_DIR", ".outbox")
    started = time.monotonic()
    print(f"starting embedded PostgreSQL in {data_dir}/pgdata ...")
    with EmbeddedPostgres(os.path.join(data_dir, "pgdata")) as server:
        summary = anyio.run(_tour, server.url)
    print("one order rolled back: its message was never stored")
    for key, value in summary.items():
        print(f"  {key:18} {', '.join(value) if isinstance(value, list) else value}")
    print(f"done in {time.monotonic() - started:.1f}s; embedded PostgreSQL stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
