"""The claim statement's parameters: what PostgresStore.claim passes, for tests and benches too."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["BY_TOPIC", "claim_params"]


BY_TOPIC = 32
"""Claims for at most this many topics read the claim index topic by topic."""


def claim_params(
    now: dt.datetime | None,
    lease: dt.timedelta,
    limit: int,
    token: uuid.UUID | None,
    *,
    topics: Collection[str] | None = None,
    caps: Mapping[str, int] | None = None,
    isolate: bool = False,
    solo: bool = False,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """The message_claim statement's parameters for PostgresStore.claim's arguments."""
    capped = {t: n for t, n in (caps or {}).items() if n > 0}
    return {
        "now": now,
        "lease": lease,
        "limit": limit,
        "token": token,
        # Joined: one text parameter, not an array of each topic (see the statement).
        "topics": None if topics is None else ",".join(topics),
        # A few topics: read each topic's front, never another topic's backlog.
        "by_topic": topics is not None and 0 < len(topics) <= BY_TOPIC,
        "capped": list(capped),
        "caps": list(capped.values()),
        "isolate": isolate,
        "solo": solo,
        "max_bytes": max_bytes,
    }
