"""Clock: where relay logic reads the time, so tests can move it instead of sleeping."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

__all__ = ["Clock", "system_clock"]

Clock = Callable[[], dt.datetime]
"""Returns the current time, timezone-aware. Tests pass one they can move."""


def system_clock() -> dt.datetime:
    """The wall clock, in UTC."""
    return dt.datetime.now(dt.UTC)
