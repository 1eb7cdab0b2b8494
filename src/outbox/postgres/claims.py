"""The claim statement's parameters: a ClaimRequest as message_claim reads it
(what PostgresStore.claim_many passes, for tests and benches too), and the
form of the statement that request runs.

Relays prepare nothing (poolers), so every claim is planned, and the planner
plans every read of the statement whether the request uses it or not. A
relay of a few topics never reads the `ready` rows of every topic, and one
without caps never reads `capped`: the statement it runs leaves them out,
which halves the claim's planning. One text, message_claim, stays the source.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any, LiteralString

from outbox.postgres.queries import QUERIES
from outbox.requests import ClaimRequest, Orphans

__all__ = ["BY_TOPIC", "FORMS", "claim_params", "claim_statement", "without"]


EVERY_SLOT = (-1, 0, 1)
"""The long-stay partition and the ring's two slots (migration 0018)."""

BY_TOPIC = 32
"""Claims for at most this many topics read the claim index topic by topic."""


def claim_params(
    request: ClaimRequest, token: uuid.UUID | None, slots: Sequence[int] = EVERY_SLOT
) -> dict[str, Any]:
    """The message_claim statement's parameters for ``request`` under lease ``token``,
    read from the ring's ``slots`` (outbox.postgres.ring)."""
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
        "a": "-infinity" if request.after is None else request.after,
        # A constant the planner prunes the other partitions with.
        "slots": list(slots),
    }


def without(query: LiteralString, *reads: str) -> LiteralString:
    """``query`` (message_claim) without the named reads (CTEs) and their arms in
    ``candidates``, which is all that refers to them."""
    out: str = query
    for name in reads:
        start = out.index(f"\n{name} AS MATERIALIZED (") + 1
        depth, at = 0, out.index("(", start)
        while True:
            depth += {"(": 1, ")": -1}.get(out[at], 0)
            at += 1
            if depth == 0:
                break
        if not out.startswith(",\n", at):
            raise ValueError(f"{name} is not followed by another read")
        out = out[:start] + out[at + 2 :]
        arm = re.compile(
            rf"^SELECT \* FROM {name}\nUNION ALL\n|^UNION ALL\nSELECT \* FROM {name}\n", re.M
        )
        out, found = arm.subn("", out)
        if found != 1 or re.search(rf"\b{name}\b", out):
            raise ValueError(f"{name} is read elsewhere than in candidates")
    return out  # derived once, at import, from the package's own statement


_CLAIM = QUERIES["message_claim"]
FORMS: dict[tuple[bool, bool], LiteralString] = {
    # (by_topic, capped): a claim reads its topics one way, never both ways.
    (True, False): without(_CLAIM, "ready", "capped"),
    (False, False): without(_CLAIM, "ready_by_topic", "capped"),
    (True, True): without(_CLAIM, "ready"),
    (False, True): without(_CLAIM, "ready_by_topic"),
}
"""Every form a claim runs (the whole of message_claim is never run)."""
_FROM = "BETWEEN %(a)s::timestamptz AND "
FIRST: dict[tuple[bool, bool], LiteralString] = {
    # Without a watermark, each read is bounded above only. A range whose
    # column has no statistics yet (a slot of the ring just emptied) is
    # guessed at a few rows, and over two slots the planner then reads and
    # sorts them all; a bound on one side is guessed at a third of the rows,
    # and the slots' indexes are read in order up to the limit.
    form: query.replace(_FROM, "<= ")
    for form, query in FORMS.items()
}
"""The forms for a claim from the first (no watermark: no snapshot held)."""


def claim_statement(params: dict[str, Any]) -> LiteralString:
    """The form of message_claim that ``params`` (claim_params) need: without the
    reads they leave empty."""
    form = bool(params["by_topic"]), bool(params["capped"])
    return FIRST[form] if params["a"] == "-infinity" else FORMS[form]
