"""Parse and print durations the way the settings spell them: 250ms, 2m, 1m30s."""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["LONGEST", "format_duration", "parse_duration"]

LONGEST = dt.timedelta(days=36500)
"""The longest duration parse_duration reads (about a century): anything longer
is a typo, and would overflow a date once added to now."""

_UNITS = {
    "us": dt.timedelta(microseconds=1),
    "µs": dt.timedelta(microseconds=1),
    "ms": dt.timedelta(milliseconds=1),
    "s": dt.timedelta(seconds=1),
    "m": dt.timedelta(minutes=1),
    "h": dt.timedelta(hours=1),
    "d": dt.timedelta(days=1),
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|µs|ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(text: str | float | dt.timedelta) -> dt.timedelta:
    """Parse ``1s``, ``250ms``, ``1m30s``, ``1.5h``, ``7d`` or plain seconds (``30``, ``0.5``).

    Raises ValueError for anything else, including negative durations.
    """
    try:
        value = _parse(text)
    except (OverflowError, ValueError) as exc:
        if "not a duration" in str(exc):
            raise
        raise ValueError(f"{_shown(text)} is too long (at most {LONGEST.days}d)") from None
    if value < dt.timedelta(0):
        raise ValueError(f"{_shown(text)} is negative")
    if value > LONGEST:
        raise ValueError(f"{_shown(text)} is too long (at most {LONGEST.days}d)")
    return value


def _parse(text: str | float | dt.timedelta) -> dt.timedelta:
    if isinstance(text, dt.timedelta):
        return text
    if isinstance(text, int | float):
        return dt.timedelta(seconds=text)
    s = text.strip()
    if _NUMBER.fullmatch(s):
        return dt.timedelta(seconds=float(s))
    pos, value = 0, dt.timedelta(0)
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        value += float(match[1]) * _UNITS[match[2]]
        pos = match.end()
    if pos != len(s) or not s:
        raise ValueError(
            f"{_shown(text)} is not a duration "
            "(examples: 250ms, 30s, 2m, 1m30s, 1h, 7d, or seconds)"
        )
    return value


def _shown(text: object) -> str:
    """``text`` for an error message: a 400-digit number is not worth repeating."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "...'"


def format_duration(value: dt.timedelta) -> str:
    """The shortest spelling parse_duration reads back: 2m, 1m30s, 250ms."""
    micros = value // dt.timedelta(microseconds=1)
    if micros == 0:
        return "0s"
    if micros % 1_000_000:
        if micros % 1000 == 0:
            return f"{micros // 1000}ms"
        return f"{micros}us"
    seconds = micros // 1_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{seconds}s" if seconds else "")
