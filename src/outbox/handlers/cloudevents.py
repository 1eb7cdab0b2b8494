"""CloudEvents 1.0 in binary mode: the message's attributes as transport headers.

A topic with ``cloudEvents: true`` sends each message as a CloudEvent whose
data is the payload, unchanged (``datacontenttype`` is the transport's own
``application/json`` content type), and whose attributes travel beside it:

- ``id``: the message id (the same on every attempt, so a consumer's CloudEvents
  dedupe by source and id drops repeats);
- ``source``: ``/outbox/topics/<topic>``;
- ``type``: the topic;
- ``time``: when the message was added (RFC 3339, UTC);
- ``subject``: the message's key, when it has one;
- ``specversion``: ``1.0``.

Each protocol binding names them its own way: ``ce-<attribute>`` headers over
HTTP and NATS, ``cloudEvents:<attribute>`` application properties over AMQP.
"""

from __future__ import annotations

from urllib.parse import quote

from outbox.message import Message

__all__ = ["amqp_properties", "attributes", "ce_headers"]

_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')


def attributes(m: Message) -> dict[str, str]:
    """The CloudEvents context attributes of ``m`` (data aside)."""
    found = {
        "specversion": "1.0",
        "id": str(m.id),
        "source": f"/outbox/topics/{m.topic}",
        "type": m.topic,
        "time": m.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    if m.key is not None:
        found["subject"] = m.key
    return found


def ce_headers(m: Message) -> dict[str, str]:
    """The HTTP and NATS bindings' headers: ``ce-<attribute>``, each value
    percent-encoded outside printable ASCII (and for space, ``"`` and ``%``), as
    the HTTP binding says."""
    return {f"ce-{name}": quote(value, safe=_SAFE) for name, value in attributes(m).items()}


def amqp_properties(m: Message) -> dict[str, str]:
    """The AMQP binding's application properties: ``cloudEvents:<attribute>``."""
    return {f"cloudEvents:{name}": value for name, value in attributes(m).items()}
