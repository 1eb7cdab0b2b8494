"""Message headers: what a name and a value may be, and which names the transports own.

A message's headers travel with it to every kind: HTTP headers of a webhook,
NATS headers, AMQP properties, Redis fields. So a name is an HTTP token and a
value printable ASCII, and the names a transport gives meaning to (framing,
routing, credentials, deduplication, the relay's own) are refused where a
header is set, by a producer or by a topic's config: a message that set
``Content-Length: 0`` or ``Nats-Msg-Id`` would change what its delivery does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_VALUE",
    "RESERVED",
    "check_header",
    "message_headers",
    "reserved",
]

MAX_HEADERS = 32
"""Headers one message may carry."""
MAX_VALUE = 4096
"""Longest value, in characters."""
MAX_HEADER_BYTES = 16 * 1024
"""All names and values of one message together."""

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")
_VALUE = re.compile(r"[\x20-\x7e\t]*")
RESERVED: tuple[str, ...] = (
    # The relay's own.
    "outbox-",
    # The kinds' (each Kind's reserved_headers; tests/unit/test_kinds.py keeps
    # this the union of them): HTTP framing and credentials, Standard
    # Webhooks' signature (webhook), CloudEvents' attributes (webhook, nats,
    # amqp), NATS's own (nats).
    "authorization",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "cookie",
    "expect",
    "host",
    "idempotency-key",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-",
    "sec-",
    "webhook-",
    "ce-",
    "nats-",
)
"""Header names no producer or topic config may set, lower-case; one ending in
``-`` is a prefix. The core checks them when a message is made, so it knows the
kinds' names without importing a kind."""
_RESERVED = frozenset(n for n in RESERVED if not n.endswith("-"))
_RESERVED_PREFIXES = tuple(n for n in RESERVED if n.endswith("-"))


def reserved(name: str) -> bool:
    """Whether a transport or the relay owns header ``name`` (any case)."""
    lowered = name.lower()
    return lowered in _RESERVED or lowered.startswith(_RESERVED_PREFIXES)


def check_header(name: object, value: object, *, max_value: int = MAX_VALUE) -> None:
    """ValueError saying what is wrong with header ``name: value``, if anything."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        raise ValueError(
            f"header name {name!r} is not an HTTP token of 1 to 100 characters "
            "(letters, digits and !#$%&'*+-.^_`|~)"
        )
    if reserved(name):
        raise ValueError(
            f"header {name} is reserved (framing, routing, credentials, deduplication "
            "and the relay's own headers are set by the relay)"
        )
    if not isinstance(value, str):
        raise ValueError(f"the value of header {name} is a string, not {type(value).__name__}")
    if len(value) > max_value or not _VALUE.fullmatch(value):
        raise ValueError(
            f"the value of header {name} must be printable ASCII of at most {max_value} characters"
        )


def message_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` checked and with lower-case names, or ValueError saying why not.

    Names are case-insensitive (as in HTTP); two that differ only in case are refused.
    """
    if not headers:
        return {}
    if not isinstance(headers, Mapping):
        raise ValueError(f"headers are a mapping of strings, not {type(headers).__name__}")
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"a message has at most {MAX_HEADERS} headers, not {len(headers)}")
    found: dict[str, str] = {}
    size = 0
    for name, value in headers.items():
        check_header(name, value)
        lowered = name.lower()
        if lowered in found:
            raise ValueError(f"header {lowered} appears twice once names are lower-case")
        found[lowered] = value
        size += len(name) + len(value)
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"headers hold {size} characters; at most {MAX_HEADER_BYTES}")
    return found
