"""What the operator commands print: tables, JSON, times, and the confirmation prompt."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from outbox.errors import ConfigError
from outbox.store import StoredMessage

__all__ = ["Refused", "as_json", "confirm", "iso", "print_json", "short", "table", "when"]

_ERROR_WIDTH = 60


class Refused(ConfigError):
    """The operator said no, or could not be asked."""


def when(at: dt.datetime | None) -> str:
    return "-" if at is None else at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def short(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= _ERROR_WIDTH else text[: _ERROR_WIDTH - 1] + "…"


def as_json(s: StoredMessage, *, payload: bool = False) -> dict[str, Any]:
    """A stored message as a JSON object (the payload only when asked)."""
    out: dict[str, Any] = {
        "id": str(s.message.id),
        "topic": s.message.topic,
        "attempts": s.message.attempts,
        "created_at": iso(s.message.created_at),
        "buried_at": iso(s.buried_at),
        "due_at": iso(s.due_at),
        "leased_until": iso(s.leased_until),
        "last_error": s.last_error,
        "requeues": s.requeues,
        "requeued_at": iso(s.requeued_at),
        "bytes": len(s.message.payload) if s.size is None else s.size,
    }
    if payload:
        try:
            out["payload"] = s.message.json()
        except RecursionError:  # nested too deep to parse: the text as stored
            out["payload"] = s.message.payload.decode("utf-8", "replace")
    return out


def print_json(value: Any, out: TextIO, *, ascii_only: bool = True) -> None:
    """``value`` as indented JSON, one document ending with a newline."""
    json.dump(value, out, indent=2, ensure_ascii=ascii_only)
    out.write("\n")


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Print rows with aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


def confirm(question: str, *, yes: bool, ask: Callable[[str], str] | None = None) -> None:
    """Go on when ``yes`` or the operator answers y; else raise Refused."""
    if yes:
        return
    if ask is None:
        if not sys.stdin.isatty():
            raise Refused("--yes", "no terminal to ask for confirmation; add --yes")
        ask = input
    if ask(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
        raise Refused("--yes", "not confirmed; nothing changed")
