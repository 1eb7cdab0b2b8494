"""The relay: claim due messages under fenced leases, deliver, settle; one of a fleet.

Parts: ``core`` (the pipeline), ``deliver`` and ``inflight`` (what it holds and
hands to handlers), ``settle`` (outcomes, written in batches and fenced),
``routing`` (topic -> handler and limits), ``fleet`` (registration, clock skew,
the unserved sweep), ``backoff``, ``config``.

Names load on first use: reading a RelayConfig (``outbox.relay.config``)
loads no pipeline, metrics or event loop library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.clock import Clock, system_clock
from outbox.handler import Handler, HandlerKind
from outbox.lazy import loader

# Its module's name: imported here, so the package's attribute is the function.
from outbox.relay.backoff import backoff

if TYPE_CHECKING:
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

__getattr__ = loader(
    __name__, {"Relay": "outbox.relay.core", "clean_reason": "outbox.relay.settle"}
)
