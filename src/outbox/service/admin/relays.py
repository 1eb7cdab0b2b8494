"""``outbox relays``: the fleet as its registrations show it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from outbox.service.admin.output import iso, print_json, table, when
from outbox.store import Operator, RelayInfo

__all__ = ["relay_record", "relays_list", "serving_relays"]


def serving_relays(relays: Sequence[RelayInfo]) -> dict[str, int]:
    """How many of ``relays`` serve each topic."""
    counts: dict[str, int] = {}
    for r in relays:
        for t in r.topics:
            counts[t] = counts.get(t, 0) + 1
    return counts


def relay_record(r: RelayInfo) -> dict[str, Any]:
    """A relay as `outbox relays --output json` and the console show it."""
    return {
        "id": str(r.id),
        "host": r.host,
        "pid": r.pid,
        "version": r.version,
        "topics": list(r.topics),
        "kinds": list(r.kinds),
        "handlers": list(r.handlers),
        "started_at": iso(r.started_at),
        "seen_at": iso(r.seen_at),
    }


async def relays_list(store: Operator, *, output: str, out: TextIO | None = None) -> None:
    """The live relays and what each serves, so disagreements between them show."""
    out = out or sys.stdout  # the stream of now, not of import time
    found = await store.relays()
    if output == "json":
        print_json([relay_record(r) for r in found], out)
        return
    if not found:
        out.write("no live relays\n")
        return
    rows = [["ID", "HOST", "PID", "VERSION", "STARTED", "SEEN", "KINDS", "TOPICS"]]
    rows += [
        [
            str(r.id)[:8],
            r.host,
            str(r.pid),
            r.version,
            when(r.started_at),
            when(r.seen_at),
            ",".join(r.kinds) or "-",
            ",".join(r.topics) or "-",
        ]
        for r in found
    ]
    table(rows, out)
    every = sorted({t for r in found for t in r.topics})
    partial = [t for t in every if not all(t in r.topics for r in found)]
    if partial:
        out.write(
            "\nserved by some relays only (a rolling deploy, or relays configured "
            f"differently): {', '.join(partial)}\n"
        )
