"""Messages: one side effect to deliver, encoded when it is created.

A message's payload is JSON encoded once, by :func:`new_message`, so the bytes
the relay hands to a handler are exactly the bytes the producer committed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import uuid
from decimal import Decimal
from typing import Any

import uuid_utils.compat
from pydantic import BaseModel

from outbox.errors import EncodeError

__all__ = ["TOPIC_MAX_LENGTH", "Message", "new_message", "validate_topic"]

TOPIC_MAX_LENGTH = 200
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
    lease: uuid.UUID | None = dataclasses.field(default=None, compare=False, repr=False)
    """The token of the claim that leased it. The store applies a write-back that
    carries it (retry, bury, release) only while no later claim has taken the
    message: a relay that stalled past its lease changes nothing. Set by
    ``Store.claim``; None on a message that was never claimed."""

    def json(self) -> Any:
        """The payload, decoded."""
        return json.loads(self.payload)


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


def new_message(topic: str, payload: Any, now: dt.datetime) -> Message:
    """Return a message for ``topic`` with ``payload`` encoded as compact JSON.

    ``payload`` may be anything JSON can hold, a pydantic model or a dataclass
    (also nested; datetimes, dates, UUIDs and Decimals become strings). The id
    is a UUIDv7, so ids sort roughly by creation time. ``now`` must be aware;
    ``created_at`` is ``now`` in UTC, truncated to whole milliseconds.
    """
    validate_topic(topic)
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("outbox: now must be timezone-aware (a naive datetime has no instant)")
    try:
        data = json.dumps(
            payload,
            default=_encode_default,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(topic, str(exc)) from exc
    created = now.astimezone(dt.UTC)
    created = created.replace(microsecond=created.microsecond // 1000 * 1000)
    return Message(id=uuid_utils.compat.uuid7(), topic=topic, payload=data, created_at=created)


def _encode_default(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
