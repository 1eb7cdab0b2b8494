"""What makes a topic registry entry deliverable: one check for the controller and the CLI.

`kubectl apply` of an OutboxTopic and `outbox topics set` must accept and
refuse exactly the same entries, or a topic quietly stops being delivered with
only a relay warning to say why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from outbox.durations import format_duration
from outbox.handler import HandlerKind
from outbox.store import TopicSettings

__all__ = ["MAX_ATTEMPTS", "MAX_IN_FLIGHT", "EntryError", "check_entry"]

MAX_ATTEMPTS = 1000
MAX_IN_FLIGHT = 100_000


class EntryError(ValueError):
    """An entry relays could not deliver as asked. ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def check_entry(
    entry: TopicSettings,
    *,
    lease: dt.timedelta,
    builtin_topics: frozenset[str],
    kinds: Mapping[str, HandlerKind],
) -> None:
    """Raise EntryError when relays could not deliver ``entry`` as it asks.

    The handler must be a built-in topic's or a known kind whose builder takes
    the config (the same code the relays run); a topic with no built-in
    handler needs one, unless it is paused; the timeout must stay below the
    relays' lease; limits must be whole numbers in range.
    """
    handler = entry.handler
    if handler is None:
        # A paused topic needs no handler yet: its messages wait, never buried.
        if entry.topic not in builtin_topics and entry.enabled:
            raise EntryError(
                "handler",
                f"{entry.topic} has no built-in handler; name one of {sorted(kinds)}",
            )
        if entry.config:
            raise EntryError("config", "a built-in handler takes no config")
    elif handler in kinds:
        try:
            kinds[handler](entry.config)
        except (ValueError, TypeError) as exc:
            raise EntryError("config", f"for handler {handler}: {exc}") from None
    elif handler not in builtin_topics:
        known = sorted(set(kinds) | builtin_topics)
        raise EntryError("handler", f"{handler!r} is unknown; known: {known}")
    if entry.on_buried not in (None, "block", "skip"):
        raise EntryError("ordering", f"onBuried is block or skip, not {entry.on_buried!r}")
    if entry.timeout is not None:
        if entry.timeout <= dt.timedelta(0):
            raise EntryError("timeout", "must be longer than 0s")
        if entry.timeout >= lease:
            raise EntryError(
                "timeout",
                f"{format_duration(entry.timeout)} does not stay below the relays' lease "
                f"({format_duration(lease)}): a slow delivery could overlap its retry",
            )
    for field, value, most in (
        ("maxAttempts", entry.max_attempts, MAX_ATTEMPTS),
        ("maxInFlight", entry.max_in_flight, MAX_IN_FLIGHT),
    ):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most
        ):
            raise EntryError(field, f"must be a whole number from 1 to {most}")
