"""Messages: one side effect to deliver, encoded when it is created.

A message's payload is JSON encoded once, by :func:`new_message`, so the bytes
the relay hands to a handler are exactly the bytes the producer committed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import re
import sys
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeVar

import uuid_utils.compat

from outbox.errors import ConfigError, EncodeError, PayloadMismatch, first_line
from outbox.headers import message_headers
from outbox.tracing import trace_headers, tracing

__all__ = [
    "MAX_KEY",
    "MAX_PAYLOAD",
    "TOPIC_MAX_LENGTH",
    "Message",
    "check_message",
    "loads_strict",
    "new_message",
    "parse_size",
    "validate_key",
    "validate_topic",
]

T = TypeVar("T")

TOPIC_MAX_LENGTH = 200
MAX_PAYLOAD = 1024 * 1024
"""The default largest payload, in bytes of JSON; OUTBOX_MAX_PAYLOAD sets another."""
_SIZE = re.compile(r"(\d+)\s*(|b|kib|mib)", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024 * 1024}


def parse_size(text: str) -> int:
    """Bytes in ``text`` (like 262144, 256KiB or 1MiB), from 1 byte to 64MiB;
    ValueError otherwise. OUTBOX_MAX_PAYLOAD's parser, here and in the settings."""
    match = _SIZE.fullmatch(text.strip())
    size = int(match[1]) * _UNITS[match[2].lower()] if match else 0
    if not 1 <= size <= 64 * 1024 * 1024:
        raise ValueError("must be a size from 1 byte to 64MiB (like 262144 or 256KiB)")
    return size


@functools.cache
def max_payload() -> int:
    """The largest payload producers may add: OUTBOX_MAX_PAYLOAD (bytes, KiB or MiB).

    Read once a process, when the first message is made or added: an
    application sets it in its environment before that. ``max_payload.cache_clear()``
    reads it again.
    """
    text = os.environ.get("OUTBOX_MAX_PAYLOAD", "").strip()
    if not text:
        return MAX_PAYLOAD
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ConfigError("OUTBOX_MAX_PAYLOAD", str(exc)) from None


def _size_problem(size: int) -> str | None:
    limit = max_payload()
    if size > limit:
        return f"payload is {size} bytes of JSON; OUTBOX_MAX_PAYLOAD allows {limit}"
    return None


_TOPIC = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """One side effect to deliver."""

    id: uuid.UUID
    topic: str
    payload: bytes
    """JSON, UTF-8."""
    created_at: dt.datetime
    """UTC. The message is first due at this time."""
    attempts: int = 0
    """Times the message was claimed, this one included. Set by ``Store.claim``.

    A claim that finds the message's earlier lease ran out while it shared its
    relay with other messages does not count that lost attempt (another message
    may have crashed the relay); see the relay's poison isolation.
    """
    deliver_at: dt.datetime | None = None
    """UTC. Not claimed before this time (None: at ``created_at``)."""
    key: str | None = None
    """Messages of one topic with the same key are delivered one at a time, in
    the order they were added (None: no order with any other message)."""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    """String headers, names in lower case (outbox.headers says what they may
    be). Every kind carries them: HTTP headers, NATS headers, AMQP properties.
    With OpenTelemetry in use, ``traceparent`` and ``tracestate`` of the span
    that added the message."""
    lease: uuid.UUID | None = dataclasses.field(default=None, compare=False, repr=False)
    """The token of the claim that leased it. The store applies a write-back that
    carries it (retry, bury, release) only while no later claim has taken the
    message: a relay that stalled past its lease changes nothing. Set by
    ``Store.claim``; None on a message that was never claimed."""
    slot: int | None = dataclasses.field(default=None, compare=False, repr=False)
    """Where the store found it when it claimed it (PostgresStore: the partition of
    the outbox's ring); its write-backs look there first. None: anywhere."""
    _made: bool = dataclasses.field(default=False, init=False, compare=False, repr=False)
    """Made by new_message, which checked what check_message checks. Not an
    argument, and not carried by dataclasses.replace(): a message built or
    changed by hand is checked whole."""

    def json(self) -> Any:
        """The payload, decoded."""
        return json.loads(self.payload)

    def decode(self, model: type[T]) -> T:
        """The payload as ``model``: a pydantic model or a dataclass.

        Raises :class:`~outbox.errors.PayloadMismatch` (a Permanent error, so
        the relay buries the message with the reason) when it does not fit:
        retrying cannot make a payload match its model.
        """
        try:
            validate = getattr(model, "model_validate_json", None)
            if validate is not None:  # a pydantic model
                found: T = validate(self.payload)
                return found
            data = json.loads(self.payload)
            if dataclasses.is_dataclass(model) and "pydantic" in sys.modules:
                from pydantic import TypeAdapter

                adapted: T = TypeAdapter(model).validate_python(data)
                return adapted
            if dataclasses.is_dataclass(model):
                if not isinstance(data, dict):
                    raise TypeError(f"expected a JSON object, got {type(data).__name__}")
                made: T = model(**data)
                return made
        except (ValueError, TypeError) as exc:
            raise PayloadMismatch(self.topic, model.__name__, first_line(exc, typed=False)) from exc
        raise TypeError(f"outbox: decode takes a pydantic model or a dataclass, not {model!r}")


def validate_topic(topic: str) -> str:
    """Return ``topic`` if it is a valid topic name, else raise ValueError."""
    if not topic:
        raise ValueError("outbox: topic must not be empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise ValueError(f"outbox: topic is {len(topic)} characters, at most {TOPIC_MAX_LENGTH}")
    if not _TOPIC.fullmatch(topic):
        raise ValueError(
            f"outbox: topic {topic!r} must match [a-z0-9][a-z0-9._-]* (like orders.placed)"
        )
    return topic


def new_message(
    topic: str,
    payload: Any,
    now: dt.datetime | None = None,
    *,
    key: str | None = None,
    deliver_at: dt.datetime | None = None,
    headers: Mapping[str, str] | None = None,
) -> Message:
    """Return a message for ``topic`` with ``payload`` encoded as compact JSON.

    ``payload`` may be anything JSON can hold, a pydantic model or a dataclass
    (also nested; datetimes, dates, UUIDs and Decimals become strings). What
    would break later is refused now with :class:`~outbox.errors.EncodeError`:
    NaN, a NUL character in a string (PostgreSQL's jsonb and many consumers
    refuse it) and keys that collide once converted to strings (``{1: "a",
    "1": "b"}`` would lose one). The id is a UUIDv7, so ids sort roughly by
    creation time. ``now`` (default: the current time) and ``deliver_at`` must
    be aware; both are kept in UTC, truncated to whole milliseconds. A message
    with ``deliver_at`` is not claimed before then.

    ``key`` (at most MAX_KEY characters) orders the topic's messages that share
    it: each is delivered only after every earlier one of the key was delivered
    (or buried, where the topic skips buried messages), one at a time.

    ``headers`` (string names and values, see outbox.headers) travel with the
    message to its handler and on with every kind. When the application uses
    OpenTelemetry and a span is active, the span's ``traceparent`` and
    ``tracestate`` are added (unless ``headers`` has them), so the delivery
    continues the producer's trace.
    """
    validate_topic(topic)
    validate_key(key)
    try:
        fields = message_headers(headers)
    except ValueError as exc:
        raise ValueError(f"outbox: {exc}") from None
    if tracing():  # only an application that traces pays
        fields = {**trace_headers(), **fields}
    created = _instant(now or dt.datetime.now(dt.UTC), "now")
    later = None if deliver_at is None else _instant(deliver_at, "deliver_at")
    try:
        data = json.dumps(
            payload,
            default=_encode_default,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode()
        _check(json.loads(data, object_pairs_hook=_unique_keys))
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(topic, str(exc)) from exc
    problem = _size_problem(len(data))
    if problem:
        raise EncodeError(topic, problem)
    m = Message(
        id=uuid_utils.compat.uuid7(),
        topic=topic,
        payload=data,
        created_at=created,
        deliver_at=later,
        key=key,
        headers=fields,
    )
    object.__setattr__(m, "_made", True)
    return m


MAX_KEY = 200
"""Longest key, in characters."""


def validate_key(key: object) -> None:
    """ValueError unless ``key`` is None or a string of 1 to MAX_KEY characters without NUL."""
    if key is None:
        return
    if not isinstance(key, str) or not key:
        raise ValueError(f"outbox: a message key is a non-empty string, not {key!r}")
    if len(key) > MAX_KEY:
        raise ValueError(f"outbox: a message key has at most {MAX_KEY} characters, not {len(key)}")
    if "\x00" in key:
        raise ValueError("outbox: a message key may not hold a NUL character")


def loads_strict(text: str | bytes) -> Any:
    """Decode JSON, refusing what new_message refuses: NaN and infinities, NUL
    characters, keys that appear twice. Raises ValueError saying which."""
    value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    _check(value)
    return value


def check_message(m: Message) -> Message:
    """``m``, or ValueError when it could not have come from new_message: a bad topic,
    or a payload that is not JSON new_message would write, or a naive datetime.

    A message new_message made is not checked whole again: its fields are
    immutable and were checked then. Its headers (a mapping anyone may change)
    and its size (against OUTBOX_MAX_PAYLOAD now) are.
    """
    if m.headers:
        try:
            if message_headers(m.headers) != dict(m.headers):
                raise ValueError("header names are lower case (new_message makes them so)")
        except ValueError as exc:
            raise ValueError(f"outbox: headers of {m.id}: {exc}") from None
    problem = _size_problem(len(m.payload))
    if problem:
        raise ValueError(f"outbox: {m.id} ({m.topic}): {problem}")
    if m._made:
        return m
    validate_topic(m.topic)
    validate_key(m.key)
    for name, at in (("created_at", m.created_at), ("deliver_at", m.deliver_at)):
        if at is not None and (at.tzinfo is None or at.utcoffset() is None):
            raise ValueError(f"outbox: {name} of {m.id} must be timezone-aware")
    try:
        loads_strict(m.payload)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"outbox: payload of {m.id} ({m.topic}): {exc}") from None
    return m


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _instant(at: dt.datetime, name: str) -> dt.datetime:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"outbox: {name} must be timezone-aware (a naive datetime has no instant)")
    at = at.astimezone(dt.UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key!r} appears twice once keys are strings")
        found[key] = value
    return found


def _check(value: Any) -> None:
    """Refuse NUL characters anywhere in the decoded payload."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a NUL character (\\u0000) in a string; PostgreSQL's jsonb refuses it")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check(k)
            _check(v)
    elif isinstance(value, list):
        for v in value:
            _check(v)


def _encode_default(value: object) -> Any:
    dump = getattr(value, "model_dump", None)
    if dump is not None and "pydantic" in sys.modules:  # a pydantic model
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
