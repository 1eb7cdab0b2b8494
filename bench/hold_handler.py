"""OUTBOX_HANDLERS for python -m bench memory: its handler keeps each message BENCH_HOLD s."""

from __future__ import annotations

import os

import anyio

from outbox import Message


async def hold(m: Message) -> None:
    await anyio.sleep(float(os.environ.get("BENCH_HOLD", "0.5")))


handlers = {"bench.hold": hold}
