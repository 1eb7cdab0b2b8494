"""Handlers for relay processes under test: each delivery is recorded in PostgreSQL.

A relay started with OUTBOX_HANDLERS=tests.integration.recording:handlers
inserts one row into ``deliveries`` (message id, its pid, attempt) per call,
through its own connection, before the relay acks. RECORDING_DELAY slows each
delivery down so that a test can interrupt a run in the middle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import psycopg

from outbox import Message, Permanent

TOPIC = "test.record"
DDL = """
CREATE TABLE IF NOT EXISTS deliveries (
    seq        bigserial PRIMARY KEY,  -- insertion order (ctid order is not)
    message_id uuid      NOT NULL,
    pid        integer   NOT NULL,
    attempt    integer   NOT NULL
)
"""

_conn: psycopg.AsyncConnection[Any] | None = None
_lock: anyio.Lock | None = None


async def record(m: Message) -> None:
    global _conn, _lock
    if _lock is None:
        _lock = anyio.Lock()
    async with _lock:
        if _conn is None or _conn.closed:
            _conn = await psycopg.AsyncConnection.connect(
                os.environ["OUTBOX_DATABASE_URL"], autocommit=True
            )
        try:
            await _conn.execute(
                "INSERT INTO deliveries (message_id, pid, attempt) VALUES (%s, %s, %s)",
                (m.id, os.getpid(), m.attempts),
            )
        except psycopg.OperationalError:
            await _conn.close()
            raise
    delay = float(os.environ.get("RECORDING_DELAY", "0"))
    if delay:
        await anyio.sleep(delay)


def handlers() -> dict[str, Any]:
    return {TOPIC: record}


def _append(line: str) -> None:
    """One line to RECORDING_FILE, written whole (several processes share the file)."""
    fd = os.open(os.environ["RECORDING_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


async def record_to_file(m: Message) -> None:
    """One line per handler start in RECORDING_FILE: what survives the
    database's own failover."""
    _append(f"{m.id} {os.getpid()} {m.attempts}")


def file_handlers() -> dict[str, Any]:
    return {TOPIC: record_to_file}


KEYED = "test.keyed"


async def keyed_start(m: Message) -> None:
    """Record the start (key, n, pid, attempt, id) in RECORDING_FILE; then one
    first attempt in 30 (by id, so every relay agrees) fails."""
    _append(f"{m.key} {m.json()['n']} {os.getpid()} {m.attempts} {m.id}")
    delay = float(os.environ.get("RECORDING_DELAY", "0"))
    if delay:
        await anyio.sleep(delay)
    if m.json().get("poison"):
        raise Permanent("a payload no retry can help")
    if m.attempts == 1 and m.id.int % 30 == 0:
        raise ConnectionError("receiver hiccup")


def keyed_handlers() -> dict[str, Any]:
    return {KEYED: keyed_start}


def recorded(path: Any) -> list[str]:
    """The message ids RECORDING_FILE holds, one per handler start, in order."""
    try:
        return [line.split()[0] for line in Path(path).read_text().splitlines() if line]
    except FileNotFoundError:
        return []


FAILING = "test.fail"


async def fail(m: Message) -> None:
    raise ConnectionRefusedError("receiver down")


def failing_handlers() -> dict[str, Any]:
    """A topic whose handler always fails, so its messages end up buried."""
    return {FAILING: fail}


def broken_handlers() -> dict[str, Any]:
    """An OUTBOX_HANDLERS factory that fails, as one missing a setting would."""
    raise RuntimeError("the application's factory failed")


def misnamed_handlers() -> dict[str, Any]:
    """An OUTBOX_HANDLERS factory mapping a topic new_message would refuse."""
    return {"Orders Placed": record}
