"""Webhook signatures the Standard Webhooks way, for the relay and for receivers.

A signed request carries ``webhook-id`` (the message id), ``webhook-timestamp``
(unix seconds) and ``webhook-signature: v1,<base64 HMAC-SHA256>`` over
``"<id>.<timestamp>.<body>"``: the id is signed, so a captured request replayed
under another id fails, and a receiver that drops repeats by ``webhook-id``
(or ``Idempotency-Key``, the same value) acts once. A secret that starts with
``whsec_`` is base64 after the prefix; any other secret is used as its bytes.

Receivers: ``verify(secret, request.headers, body)`` raises ``BadSignature``
or returns the message id. Standard library only, so it installs anywhere.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ["BadSignature", "secret_bytes", "sign", "signature_headers", "verify"]

PREFIX = "whsec_"
TOLERANCE = 300
"""Seconds a signature's timestamp may be off the receiver's clock, either way."""


class BadSignature(ValueError):
    """The request's signature is missing, malformed, stale or does not match."""


def secret_bytes(secret: str | bytes) -> bytes:
    """The HMAC key of ``secret``: base64 after ``whsec_``, else the text's bytes."""
    if isinstance(secret, bytes):
        return secret
    if secret.startswith(PREFIX):
        try:
            key = base64.b64decode(secret.removeprefix(PREFIX) + "==")
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be base64 after its prefix") from None
    else:
        key = secret.encode()
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for ``body`` of ``msg_id`` sent at ``timestamp``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    mac = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signature_headers(
    secret: str | bytes, msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three headers of a signed request."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: int = TOLERANCE,
    now: float | None = None,
) -> str:
    """Check a request's signature as a receiver; return its ``webhook-id``.

    Raises BadSignature when a header is missing, the timestamp is more than
    ``tolerance`` seconds from ``now`` (default: this machine's clock), or no
    ``v1`` signature matches.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not (msg_id and stamp and signatures):
        raise BadSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise BadSignature("webhook-timestamp is not a whole number of seconds") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise BadSignature("webhook-timestamp is outside the tolerance")
    expected = sign(secret, msg_id, timestamp, body).encode()
    for candidate in signatures.split():
        if hmac.compare_digest(candidate.encode(), expected):
            return msg_id
    raise BadSignature("no signature matches")
