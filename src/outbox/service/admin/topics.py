"""``outbox topics``: the topic registry as an operator sees and edits it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from outbox.durations import format_duration
from outbox.errors import ConfigError
from outbox.handler import HandlerKind
from outbox.service.admin.output import print_json, table
from outbox.service.admin.relays import serving_relays
from outbox.store import Store, TopicSettings

__all__ = ["DEFAULT", "checked", "governed", "topics_list", "topics_set"]


async def topics_list(store: Store[Any], *, output: str, out: TextIO | None = None) -> None:
    """The registry with each topic's backlog (topics with messages but no entry too)."""
    out = out or sys.stdout  # the stream of now, not of import time
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
        print_json(rows_json, out)
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
    out: TextIO | None = None,
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
    out = out or sys.stdout  # the stream of now, not of import time
    current = (await store.topics()).get(topic) or TopicSettings(topic)
    governed(current, force=force)
    fields: dict[str, Any] = {
        k: (None if v is DEFAULT else v) for k, v in changes.items() if v is not None
    }
    if "config" in fields and fields["config"] is None:
        fields["config"] = {}
    # An operator's entry may send any topic anywhere (``reroute``).
    entry = dataclasses.replace(current, source="cli", reroute=True, **fields)
    served = frozenset(t for r in await store.relays() for t in r.topics)
    checked(entry, lease=lease, kinds=kinds, served=served)
    await store.set_topic(entry, now)
    state = "enabled" if entry.enabled else "paused"
    ordering = f", on buried: {entry.on_buried}" if entry.on_buried else ""
    out.write(f"{topic}: {state}, handler {entry.handler or 'built-in'}{ordering}\n")
    return entry


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


def governed(entry: TopicSettings | None, *, force: bool, deleting: bool = False) -> None:
    """Refuse to change an entry an OutboxTopic governs, unless ``force``.

    With ``force`` the change is written as an operator's entry, which the
    controller never replaces: the resource reports a Conflict until
    ``outbox topics delete`` hands the topic back to it. ``deleting`` the
    entry, the controller writes its resource's again at its next reconcile.
    """
    source = entry.source if entry else None
    if force or not source or not source.startswith("kubernetes:"):
        return
    resource = source.removeprefix("kubernetes:")
    namespace, _, name = resource.partition("/")
    then = (
        "the entry is removed, and the controller writes the resource's again at its next reconcile"
        if deleting
        else "this change is written as an operator's override, which holds until "
        "`outbox topics delete` hands the topic back to the resource"
    )
    raise ConfigError(
        "--force",
        f"{entry.topic if entry else '?'} is governed by OutboxTopic {resource}: change it with "
        f"`kubectl -n {namespace} edit outboxtopic {name}` (with --force {then})",
    )


DEFAULT: Any = object()
"""A value for topics_set that clears an override back to the default."""
