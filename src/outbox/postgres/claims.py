"""The claim statement's parameters: a ClaimRequest as message_claim reads it
(what PostgresStore.claim_many passes, for tests and benches too)."""

from __future__ import annotations

import uuid
from typing import Any

from outbox.requests import ClaimRequest, Orphans

__all__ = ["BY_TOPIC", "claim_params"]


BY_TOPIC = 32
"""Claims for at most this many topics read the claim index topic by topic."""


def claim_params(request: ClaimRequest, token: uuid.UUID | None) -> dict[str, Any]:
    """The message_claim statement's parameters for ``request`` under lease ``token``."""
    topics = request.topics
    capped = {t: n for t, n in request.caps.items() if n > 0}
    return {
        "now": request.now,
        "lease": request.lease,
        "limit": request.limit,
        "token": token,
        # Joined: one text parameter, not an array of each topic (see the statement).
        "topics": None if topics is None else ",".join(topics),
        # A few topics: read each topic's front, never another topic's backlog.
        "by_topic": topics is not None and 0 < len(topics) <= BY_TOPIC,
        "capped": list(capped),
        "caps": list(capped.values()),
        "isolate": request.orphans is not Orphans.CLAIM,
        "solo": request.orphans is Orphans.ONLY,
        "max_bytes": request.max_bytes,
        "after": request.after,
    }
