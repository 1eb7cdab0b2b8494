"""Parse and print durations the way the settings spell them: 250ms, 2m, 1m30s."""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["format_duration", "parse_duration"]

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
    if isinstance(text, dt.timedelta):
        value = text
    elif isinstance(text, int | float):
        value = dt.timedelta(seconds=text)
    else:
        s = text.strip()
        if _NUMBER.fullmatch(s):
            value = dt.timedelta(seconds=float(s))
        else:
            pos, value = 0, dt.timedelta(0)
            for match in _PART.finditer(s):
                if match.start() != pos:
                    break
                value += float(match[1]) * _UNITS[match[2]]
                pos = match.end()
            if pos != len(s) or not s:
                raise ValueError(
                    f"{text!r} is not a duration "
                    "(examples: 250ms, 30s, 2m, 1m30s, 1h, 7d, or seconds)"
                )
    if value < dt.timedelta(0):
        raise ValueError(f"{text!r} is negative")
    return value


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
