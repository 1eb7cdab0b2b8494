"""Blocked keys: what an operator sees of a key held behind its first message."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

__all__ = ["BLOCKED_SCAN", "BlockedKey"]


@dataclasses.dataclass(frozen=True, slots=True)
class BlockedKey:
    """A key whose messages wait behind a head that is buried or keeps failing."""

    topic: str
    key: str
    head: uuid.UUID
    since: dt.datetime
    """When the head was buried; for a failing head, when it was added."""
    reason: str | None
    """The head's last error."""
    buried: bool
    waiting: int
    """Messages of the key parked behind the head (counted among at most BLOCKED_SCAN)."""


BLOCKED_SCAN = 100_000
"""Most waiting messages one keys_blocked call reads."""
