"""``outbox buried``: what an operator runs when OutboxMessagesBuried fires.

List, show, requeue and purge buried messages through the Store methods, so an
application can build the same tools on them. Payloads can hold one-time
codes: ``show`` prints one only when asked (``--payload``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import uuid
from typing import TextIO

from outbox.durations import format_duration
from outbox.service.admin.output import as_json, confirm, print_json, short, table, when
from outbox.store import BuriedFilter, Operator

__all__ = ["list_buried", "purge", "requeue", "show"]


async def list_buried(
    store: Operator,
    *,
    topic: str | None,
    within: dt.timedelta | None,
    limit: int,
    output: str,
    out: TextIO | None = None,
) -> None:
    out = out or sys.stdout  # the stream of now, not of import time
    found = await store.list_buried(topic=topic, within=within, limit=limit)
    if output == "json":
        print_json([as_json(s) for s in found], out)
        return
    if not found:
        out.write("no buried messages\n")
        return
    rows = [["ID", "TOPIC", "ATTEMPTS", "BURIED", "CREATED", "LAST ERROR"]]
    rows += [
        [
            str(s.message.id),
            s.message.topic,
            str(s.message.attempts),
            when(s.buried_at),
            when(s.message.created_at),
            short(s.last_error),
        ]
        for s in found
    ]
    table(rows, out)


async def show(
    store: Operator,
    message_id: uuid.UUID,
    *,
    payload: bool,
    output: str,
    out: TextIO | None = None,
) -> None:
    out = out or sys.stdout  # the stream of now, not of import time
    s = await store.get(message_id)
    if output == "json":
        print_json(as_json(s, payload=payload), out, ascii_only=False)
        return
    fields = [
        ("id", str(s.message.id)),
        ("topic", s.message.topic),
        ("state", "buried" if s.buried_at else "pending"),
        ("attempts", str(s.message.attempts)),
        ("created at", when(s.message.created_at)),
        ("buried at", when(s.buried_at)),
        ("due at", when(s.due_at)),
        ("leased until", when(s.leased_until)),
        ("requeues", f"{s.requeues} (last {when(s.requeued_at)})" if s.requeues else "0"),
        ("last error", s.last_error or "-"),
    ]
    for name, value in fields:
        out.write(f"{name + ':':<14}{value}\n")
    if payload:
        pretty = _pretty(s.message.payload)
        out.write("payload:\n" + "".join(f"  {line}\n" for line in pretty.splitlines()))
    else:
        out.write(f"{'payload:':<14}hidden ({len(s.message.payload)} bytes; --payload shows it)\n")


def _pretty(payload: bytes) -> str:
    """The payload indented, or as stored when it nests too deep to parse."""
    try:
        return json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    except RecursionError:
        return payload.decode("utf-8", "replace")


async def requeue(
    store: Operator,
    selection: BuriedFilter,
    *,
    dry_run: bool,
    yes: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Requeue what ``selection`` selects; return how many were (or would be)
    requeued. Everything (an empty selection) is asked about first.

    The requeue acts on what the count found (what was buried by then), so
    it can only requeue fewer. Requeued messages are due at the database's
    time, not this machine's.
    """
    out, err = out or sys.stdout, err or sys.stderr  # the streams of now, not of import time
    if selection.ids is not None:
        states = {}
        for i in selection.ids:
            states[i] = await store.get(i)  # NotFound before anything changes
        for i, state in states.items():
            if state.buried_at is None:
                err.write(f"{i}: not buried, left alone\n")
        ids = tuple(i for i, state in states.items() if state.buried_at is not None)
        if not ids:
            out.write("requeued 0 messages\n")
            return 0
        selection = dataclasses.replace(selection, ids=ids)
    found = await store.count_buried(selection)
    if dry_run:
        out.write(f"would requeue {found.count} messages\n")
        return found.count
    if selection.everything and found.count:
        confirm(f"Requeue all {found.count} buried messages?", yes=yes)
    done = 0
    if found.as_of is not None:
        selection = dataclasses.replace(selection, buried_by=found.as_of)
        done = await store.requeue(selection=selection)
    out.write(f"requeued {done} messages\n")
    return done


async def purge(
    store: Operator,
    selection: BuriedFilter,
    *,
    dry_run: bool,
    yes: bool,
    out: TextIO | None = None,
) -> int:
    """Delete the buried messages ``selection`` selects (its ages by the
    database's time), after asking; only what the count found (what was
    buried by then), so it can only delete fewer."""
    out = out or sys.stdout  # the stream of now, not of import time
    what = "messages"
    if selection.older_than is not None:
        what += f" buried more than {format_duration(selection.older_than)} ago"
    found = await store.count_buried(selection)
    if dry_run:
        out.write(f"would delete {found.count} {what}\n")
        return found.count
    done = 0
    if found.as_of is not None:
        confirm(f"Delete {found.count} {what}?", yes=yes)
        done = await store.purge_buried(
            selection=dataclasses.replace(selection, buried_by=found.as_of)
        )
    out.write(f"deleted {done} buried messages\n")
    return done
