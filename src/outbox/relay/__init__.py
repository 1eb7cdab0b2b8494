"""The relay: claim due messages under fenced leases, deliver, settle; one of a fleet.

Parts: ``core`` (the pipeline), ``settle`` (outcomes, written in batches and
fenced), ``routing`` (topic -> handler and limits), ``fleet`` (registration,
clock skew, the unserved sweep), ``backoff``.
"""

from __future__ import annotations

from outbox.clock import Clock, system_clock
from outbox.handler import Handler, HandlerKind
from outbox.relay.backoff import backoff
from outbox.relay.core import Relay
from outbox.relay.settle import clean_reason

__all__ = [
    "Clock",
    "Handler",
    "HandlerKind",
    "Relay",
    "backoff",
    "clean_reason",
    "system_clock",
]
