"""The wait before a failed message is tried again."""

from __future__ import annotations

import datetime as dt

__all__ = ["backoff"]

_CEILING = dt.timedelta(minutes=5)


def backoff(attempt: int) -> dt.timedelta:
    """The wait before retrying a message that failed on its attempt-th try.

    One second, doubling each time, at most five minutes.
    """
    attempt = max(attempt, 1)
    if attempt > 10:
        return _CEILING
    return min(dt.timedelta(seconds=1 << (attempt - 1)), _CEILING)
