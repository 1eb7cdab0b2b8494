"""The example's own tables: created by the example, never by `outbox migrate`."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg

__all__ = ["create_schema"]


async def create_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the accounts, sign-in codes and email changes tables if they are missing."""
    ddl = resources.files(__package__).joinpath("sql/schema.sql").read_text("utf-8")
    await conn.execute(ddl.encode())
