"""What a request asks for, checked at the edge: ids, topics, page sizes and
the buried filter, for the console's API and its pages alike. Anything out of
bounds is Refused with the status and a message the caller can act on."""

from __future__ import annotations

import datetime as dt
import uuid

from outbox.durations import parse_duration
from outbox.message import validate_topic
from outbox.requests import MAX_ERROR_TEXT, MAX_LISTING, MESSAGE_STATES
from outbox.store import BuriedFilter, StoredMessage

__all__ = [
    "MAX_IDS",
    "MAX_KEY",
    "MAX_LIMIT",
    "Refused",
    "cursor",
    "key",
    "limit",
    "message_id",
    "next_cursor",
    "selection",
    "state",
    "topic",
]

MAX_IDS = 1_000
"""Most message ids one request names."""
MAX_LIMIT = MAX_LISTING
"""Largest page a read returns."""
MAX_KEY = 1_000
"""Longest key a listing selects by."""

FILTER_FIELDS = frozenset({"all", "topic", "ids", "older_than", "error_contains", "buried_by"})


class Refused(Exception):
    """A request answered with ``status`` and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def state(text: str | None) -> str | None:
    if text is not None and text not in MESSAGE_STATES:
        raise Refused(400, f"state must be one of {', '.join(MESSAGE_STATES)}")
    return text


def key(text: str | None) -> str | None:
    if text is not None and not 0 < len(text) <= MAX_KEY:
        raise Refused(400, f"key must be 1 to {MAX_KEY} characters")
    return text


def message_id(text: str, what: str = "the message id") -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise Refused(400, f"{what} must be a message id (a UUID)") from None


def cursor(text: str | None) -> tuple[uuid.UUID | None, dt.datetime | None]:
    """A listing's ``after``: the last message of the page before, and for a
    listing in due order its due time (``ID~MICROSECONDS``, as ``next`` gives)."""
    if not text:
        return None, None
    ident, _, due = text.partition("~")
    if not due:
        return message_id(ident, "after"), None
    try:
        at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(due))
    except (ValueError, OverflowError):
        raise Refused(400, "after must be a listing's next cursor") from None
    return message_id(ident, "after"), at


def next_cursor(last: StoredMessage, state: str | None) -> str:
    """The cursor of the page after ``last``: its id, and in due order its due time."""
    if state not in ("pending", "due_later"):
        return str(last.message.id)
    micros = (last.due_at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return f"{last.message.id}~{micros}"


def topic(text: object) -> str:
    if not isinstance(text, str):
        raise Refused(400, "topic must be a string")
    try:
        validate_topic(text)
    except ValueError as exc:
        raise Refused(400, str(exc).removeprefix("outbox: ")) from None
    return text


def limit(text: str | None) -> int:
    if text is None:
        return 100
    try:
        n = int(text)
    except ValueError:
        raise Refused(400, "limit must be a whole number") from None
    if not 1 <= n <= MAX_LIMIT:
        raise Refused(400, f"limit must be from 1 to {MAX_LIMIT}")
    return n


def selection(raw: object) -> tuple[BuriedFilter, list[str]]:
    """The BuriedFilter a request's ``filter`` names, and the names of the fields
    it gave (for the audit line). An empty filter is refused: everything is
    ``{"all": true}``, alone."""
    if not isinstance(raw, dict):
        raise Refused(400, 'give a filter: {"topic", "ids", "older_than", "error_contains"}')
    unknown = sorted(set(raw) - FILTER_FIELDS)
    if unknown:
        raise Refused(400, f"unknown filter fields: {', '.join(unknown)}")
    named = sorted(k for k, v in raw.items() if k != "all" and v is not None)
    narrowing = [k for k in named if k != "buried_by"]  # buried_by only bounds an action
    if raw.get("all") is True:
        if narrowing:
            raise Refused(400, '"all" selects everything: give it alone')
        return BuriedFilter(buried_by=instant(raw.get("buried_by"))), []
    if not narrowing:
        raise Refused(400, 'an empty filter selects nothing; everything is {"all": true}')
    return (
        BuriedFilter(
            topic=None if raw.get("topic") is None else topic(raw["topic"]),
            ids=ids(raw.get("ids")),
            older_than=older_than(raw.get("older_than")),
            error_contains=error_text(raw.get("error_contains")),
            buried_by=instant(raw.get("buried_by")),
        ),
        named,
    )


def ids(raw: object) -> tuple[uuid.UUID, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise Refused(400, "ids must be a list of message ids")
    if len(raw) > MAX_IDS:
        raise Refused(413, f"at most {MAX_IDS} ids a request")
    try:
        return tuple(uuid.UUID(str(i)) for i in raw)
    except ValueError:
        raise Refused(400, "ids must be message ids (UUIDs)") from None


def older_than(raw: object) -> dt.timedelta | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise Refused(400, 'older_than must be a duration such as "7d"')
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise Refused(400, f"older_than: {exc}") from None


def error_text(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_ERROR_TEXT:
        raise Refused(400, f"error_contains must be 1 to {MAX_ERROR_TEXT} characters")
    return raw


def instant(raw: object) -> dt.datetime | None:
    if raw is None:
        return None
    try:
        at = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        raise Refused(400, "buried_by must be an ISO 8601 instant (a dry run's as_of)") from None
    if at.tzinfo is None:
        raise Refused(400, "buried_by needs its offset (a dry run's as_of has one)")
    return at
