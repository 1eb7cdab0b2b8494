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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from outbox.durations import format_duration
from outbox.errors import ConfigError
from outbox.relay.routing import HandlerKind
from outbox.store import RelayInfo, Store, StoredMessage, TopicSettings

__all__ = [
    "DEFAULT",
    "list_buried",
    "purge",
    "relays_list",
    "requeue",
    "serving_relays",
    "show",
    "topics_list",
    "topics_set",
]

_ERROR_WIDTH = 60


class Refused(ConfigError):
    """The operator said no, or could not be asked."""


def _when(at: dt.datetime | None) -> str:
    return "-" if at is None else at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _short(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= _ERROR_WIDTH else text[: _ERROR_WIDTH - 1] + "…"


def as_json(s: StoredMessage, *, payload: bool = False) -> dict[str, Any]:
    """A stored message as a JSON object (the payload only when asked)."""
    out: dict[str, Any] = {
        "id": str(s.message.id),
        "topic": s.message.topic,
        "attempts": s.message.attempts,
        "created_at": _iso(s.message.created_at),
        "buried_at": _iso(s.buried_at),
        "due_at": _iso(s.due_at),
        "leased_until": _iso(s.leased_until),
        "last_error": s.last_error,
        "requeues": s.requeues,
        "requeued_at": _iso(s.requeued_at),
        "bytes": len(s.message.payload) if s.size is None else s.size,
    }
    if payload:
        try:
            out["payload"] = s.message.json()
        except RecursionError:  # nested too deep to parse: the text as stored
            out["payload"] = s.message.payload.decode("utf-8", "replace")
    return out


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Print rows with aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


async def list_buried(
    store: Store[Any],
    *,
    topic: str | None,
    within: dt.timedelta | None,
    limit: int,
    output: str,
    out: TextIO = sys.stdout,
) -> None:
    found = await store.list_buried(topic=topic, within=within, limit=limit)
    if output == "json":
        json.dump([as_json(s) for s in found], out, indent=2)
        out.write("\n")
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
            _when(s.buried_at),
            _when(s.message.created_at),
            _short(s.last_error),
        ]
        for s in found
    ]
    table(rows, out)


async def show(
    store: Store[Any],
    message_id: uuid.UUID,
    *,
    payload: bool,
    output: str,
    out: TextIO = sys.stdout,
) -> None:
    s = await store.get(message_id)
    if output == "json":
        json.dump(as_json(s, payload=payload), out, indent=2, ensure_ascii=False)
        out.write("\n")
        return
    fields = [
        ("id", str(s.message.id)),
        ("topic", s.message.topic),
        ("state", "buried" if s.buried_at else "pending"),
        ("attempts", str(s.message.attempts)),
        ("created at", _when(s.message.created_at)),
        ("buried at", _when(s.buried_at)),
        ("due at", _when(s.due_at)),
        ("leased until", _when(s.leased_until)),
        ("requeues", f"{s.requeues} (last {_when(s.requeued_at)})" if s.requeues else "0"),
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


async def requeue(
    store: Store[Any],
    *,
    ids: Sequence[uuid.UUID] | None,
    topic: str | None,
    dry_run: bool,
    yes: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Requeue what the selection names; return how many were (or would be) requeued.

    Requeued messages are due at the database's time, not this machine's.
    """
    if ids is not None:
        states = {}
        for i in ids:
            states[i] = await store.get(i)  # NotFound before anything changes
        for i, state in states.items():
            if state.buried_at is None:
                err.write(f"{i}: not buried, left alone\n")
        ids = [i for i, state in states.items() if state.buried_at is not None]
        if not ids:
            out.write("requeued 0 messages\n")
            return 0
    elif not dry_run and topic is None:
        count = await store.requeue(dry_run=True)
        confirm(f"Requeue all {count} buried messages?", yes=yes)
    done = await store.requeue(ids=ids, topic=topic, dry_run=dry_run)
    verb = "would requeue" if dry_run else "requeued"
    out.write(f"{verb} {done} messages\n")
    return done


async def purge(
    store: Store[Any],
    older_than: dt.timedelta,
    *,
    topic: str | None,
    dry_run: bool,
    yes: bool,
    out: TextIO = sys.stdout,
) -> int:
    """Delete messages buried longer than ``older_than`` ago (the database's time)."""
    age = format_duration(older_than)
    count = await store.purge_buried(older_than, topic=topic, dry_run=True)
    if dry_run:
        out.write(f"would delete {count} messages buried more than {age} ago\n")
        return count
    if count:
        confirm(f"Delete {count} messages buried more than {age} ago?", yes=yes)
    done = await store.purge_buried(older_than, topic=topic)
    out.write(f"deleted {done} buried messages\n")
    return done


async def topics_list(store: Store[Any], *, output: str, out: TextIO = sys.stdout) -> None:
    """The registry with each topic's backlog (topics with messages but no entry too)."""
    entries = await store.topics()
    stats = {s.topic: s for s in await store.topic_stats()}
    names = sorted(set(entries) | set(stats))
    serving = serving_relays(await store.relays())
    if output == "json":
        rows_json = []
        for name in names:
            e, st = entries.get(name), stats.get(name)
            rows_json.append(
                {
                    "topic": name,
                    "registered": e is not None,
                    "enabled": e.enabled if e else True,
                    "handler": e.handler if e else None,
                    "config": dict(e.config) if e else {},
                    "max_attempts": e.max_attempts if e else None,
                    "timeout": format_duration(e.timeout) if e and e.timeout else None,
                    "max_in_flight": e.max_in_flight if e else None,
                    "on_buried": (e.on_buried or "block") if e else "block",
                    "source": e.source if e else None,
                    "relays": serving.get(name, 0),
                    "pending": st.pending if st else 0,
                    "buried": st.buried if st else 0,
                }
            )
        json.dump(rows_json, out, indent=2)
        out.write("\n")
        return
    if not names:
        out.write("no topics\n")
        return
    rows = [
        [
            "TOPIC",
            "ENABLED",
            "HANDLER",
            "MAX ATTEMPTS",
            "TIMEOUT",
            "IN FLIGHT",
            "RELAYS",
            "PENDING",
            "BURIED",
            "SOURCE",
        ]
    ]
    for name in names:
        e, st = entries.get(name), stats.get(name)
        rows.append(
            [
                name,
                "yes" if e is None or e.enabled else "paused",
                (e.handler if e and e.handler else "built-in"),
                str(e.max_attempts) if e and e.max_attempts else "default",
                format_duration(e.timeout) if e and e.timeout else "default",
                str(e.max_in_flight) if e and e.max_in_flight else "default",
                str(serving.get(name, 0)),
                str(st.pending if st else 0),
                str(st.buried if st else 0),
                (e.source or "-") if e else "(no entry)",
            ]
        )
    table(rows, out)


async def topics_set(
    store: Store[Any],
    topic: str,
    now: dt.datetime,
    *,
    lease: dt.timedelta,
    out: TextIO = sys.stdout,
    force: bool = False,
    kinds: Mapping[str, HandlerKind] | None = None,
    **changes: Any,
) -> TopicSettings:
    """Change the fields given in ``changes`` of a topic's entry (made if missing).

    ``DEFAULT`` as a value clears an override. The entry that results is
    checked as the controller checks an OutboxTopic (``kinds``: the handler
    kinds to check a handler and its config with) and refused, unchanged, if
    relays could not deliver it. An entry an OutboxTopic governs is refused
    unless ``force``.
    """
    current = (await store.topics()).get(topic) or TopicSettings(topic)
    governed(current, force=force)
    fields: dict[str, Any] = {
        k: (None if v is DEFAULT else v) for k, v in changes.items() if v is not None
    }
    if "config" in fields and fields["config"] is None:
        fields["config"] = {}
    entry = dataclasses.replace(current, source="cli", **fields)
    served = frozenset(t for r in await store.relays() for t in r.topics)
    checked(entry, lease=lease, kinds=kinds, served=served)
    await store.set_topic(entry, now)
    state = "enabled" if entry.enabled else "paused"
    ordering = f", on buried: {entry.on_buried}" if entry.on_buried else ""
    out.write(f"{topic}: {state}, handler {entry.handler or 'built-in'}{ordering}\n")
    return entry


def serving_relays(relays: Sequence[RelayInfo]) -> dict[str, int]:
    """How many of ``relays`` serve each topic."""
    counts: dict[str, int] = {}
    for r in relays:
        for t in r.topics:
            counts[t] = counts.get(t, 0) + 1
    return counts


async def relays_list(store: Store[Any], *, output: str, out: TextIO = sys.stdout) -> None:
    """The live relays and what each serves, so disagreements between them show."""
    found = await store.relays()
    if output == "json":
        rows_json = [
            {
                "id": str(r.id),
                "host": r.host,
                "pid": r.pid,
                "version": r.version,
                "topics": list(r.topics),
                "kinds": list(r.kinds),
                "started_at": _iso(r.started_at),
                "seen_at": _iso(r.seen_at),
            }
            for r in found
        ]
        json.dump(rows_json, out, indent=2)
        out.write("\n")
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
            _when(r.started_at),
            _when(r.seen_at),
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


_FLAGS = {
    "handler": "--handler",
    "config": "--config",
    "timeout": "--timeout",
    "maxAttempts": "--max-attempts",
    "maxInFlight": "--max-in-flight",
    "ordering": "--on-buried",
}


def checked(
    entry: TopicSettings,
    *,
    lease: dt.timedelta,
    kinds: Mapping[str, HandlerKind] | None = None,
    served: frozenset[str] = frozenset(),
) -> TopicSettings:
    """``entry``, or ConfigError naming the flag when relays could not deliver it.

    ``served``: topics live relays have handlers of their own for
    (OUTBOX_HANDLERS), which an entry may tune without naming a handler.
    """
    from outbox.handlers import HandlerKinds
    from outbox.handlers.mail.topics import TOPICS
    from outbox.handlers.registry import EntryError, check_entry

    try:
        check_entry(
            entry,
            lease=lease,
            builtin_topics=TOPICS | served,
            kinds=HandlerKinds().mapping if kinds is None else kinds,
        )
    except EntryError as exc:
        raise ConfigError(_FLAGS.get(exc.field, exc.field), exc.reason) from None
    return entry


def governed(entry: TopicSettings | None, *, force: bool) -> None:
    """Refuse to change an entry an OutboxTopic governs, unless ``force``.

    The controller writes its resource's spec back at its next reconcile, so
    a change here would be reverted within its status interval, silently.
    """
    source = entry.source if entry else None
    if force or not source or not source.startswith("kubernetes:"):
        return
    resource = source.removeprefix("kubernetes:")
    namespace, _, name = resource.partition("/")
    raise ConfigError(
        "--force",
        f"{entry.topic if entry else '?'} is governed by OutboxTopic {resource}: change it with "
        f"`kubectl -n {namespace} edit outboxtopic {name}` (with --force this change is "
        "written, and the controller puts the resource's spec back at its next reconcile)",
    )


DEFAULT: Any = object()
"""A value for topics_set that clears an override back to the default."""
