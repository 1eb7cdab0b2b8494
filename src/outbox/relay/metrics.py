"""Prometheus collectors for the relay, one set per registry.

outbox_delivered_total and outbox_buried_total are the design's
outbox.delivered and outbox.buried; alert on the second.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["MAX_TOPIC_LABELS", "OTHER", "BacklogMetrics", "RelayMetrics", "TopicMetrics"]

OTHER = "_other"
"""The topic label of every topic the relay neither serves nor finds in the registry."""
MAX_TOPIC_LABELS = 500
"""Most distinct topic labels one relay exports; the rest count under OTHER."""

_lock = threading.Lock()
_made: weakref.WeakKeyDictionary[CollectorRegistry, dict[type[Any], Any]] = (
    weakref.WeakKeyDictionary()
)
M = TypeVar("M")


def _once(cls: type[M], registry: CollectorRegistry | None) -> M:
    """The ``cls`` collectors of ``registry``: registering them twice is an error."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        made = _made.setdefault(registry, {})
        if cls not in made:
            made[cls] = cls(registry)  # type: ignore[call-arg]
        found: M = made[cls]
        return found


class TopicMetrics:
    """One topic's children of the relay's collectors, looked up once."""

    __slots__ = ("buried", "delivered", "duration", "lease_lost", "retried")

    def __init__(self, metrics: RelayMetrics, topic: str) -> None:
        self.delivered = metrics.delivered.labels(topic)
        self.buried = metrics.buried.labels(topic)
        self.retried = metrics.retried.labels(topic)
        self.duration = metrics.duration.labels(topic)
        self.lease_lost = metrics.lease_lost.labels(topic)


class RelayMetrics:
    """The relay's collectors in one registry, shared by every relay using it."""

    delivered: Counter
    buried: Counter
    retried: Counter
    dropped: Counter
    duration: Histogram
    lease_lost: Counter
    clock_skew: Gauge
    in_flight: Gauge
    database_up: Gauge
    last_poll: Gauge
    labelled: frozenset[str]
    """The topics that are label values; the rest count under OTHER."""
    registry: CollectorRegistry

    @classmethod
    def of(cls, registry: CollectorRegistry | None) -> RelayMetrics:
        """The metrics registered in ``registry`` (default: the global one), made once."""
        return _once(cls, registry)

    def topic(self, topic: str) -> TopicMetrics:
        """The children of ``topic``'s label, made (and exported at 0) on first use."""
        found = self._topics.get(topic)
        if found is None:
            label = self.label(topic)
            found = self._topics.get(label)
            if found is None:
                found = self._topics[label] = TopicMetrics(self, label)
        return found

    def label(self, topic: str) -> str:
        """``topic`` if it may be a label value, else OTHER: producers choose topics."""
        return topic if topic in self.labelled else OTHER

    def label_topics(self, topics: Iterable[str]) -> None:
        """Label these topics (served or registered; at most MAX_TOPIC_LABELS), export
        them at 0, and remove the series of topics no longer among them."""
        keep = frozenset(sorted(set(topics))[:MAX_TOPIC_LABELS])
        if keep == self.labelled:
            return
        for label in [t for t in self._topics if t not in keep and t != OTHER]:
            del self._topics[label]
            for collector in (self.delivered, self.buried, self.retried, self.duration):
                with contextlib.suppress(KeyError):
                    collector.remove(label)
            with contextlib.suppress(KeyError):
                self.lease_lost.remove(label)
        self.labelled = keep
        for topic in keep:
            self.topic(topic)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._topics: dict[str, TopicMetrics] = {}
        self.labelled = frozenset[str]()
        self.delivered = Counter(
            "outbox_delivered",
            "Messages delivered and acknowledged.",
            ["topic"],
            registry=registry,
        )
        self.buried = Counter(
            "outbox_buried",
            "Messages buried: kept, undelivered, for an operator to inspect.",
            ["topic"],
            registry=registry,
        )
        self.retried = Counter(
            "outbox_retried",
            "Deliveries that failed and were scheduled again.",
            ["topic"],
            registry=registry,
        )
        self.dropped = Counter(
            "outbox_dropped",
            "Messages acked unsent because they no longer needed delivering.",
            ["topic", "reason"],
            registry=registry,
        )
        self.duration = Histogram(
            "outbox_delivery_duration_seconds",
            "Time one handler call took, whatever its outcome.",
            ["topic"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.lease_lost = Counter(
            "outbox_lease_lost",
            "Write-backs that changed nothing because another claim had taken the "
            "message (this relay held it past its lease).",
            ["topic"],
            registry=registry,
        )
        self.clock_skew = Gauge(
            "outbox_clock_skew_seconds",
            "This relay's clock minus the database's (leases use the database's).",
            registry=registry,
        )
        self.in_flight = Gauge(
            "outbox_in_flight_messages",
            "Messages this relay has claimed and not yet settled.",
            registry=registry,
        )
        self.database_up = Gauge(
            "outbox_database_up",
            "1 when this relay's last claim or housekeeping reached the database, else 0.",
            registry=registry,
        )
        self.last_poll = Gauge(
            "outbox_last_poll_timestamp_seconds",
            "Unix time of this relay's last successful claim.",
            registry=registry,
        )


class BacklogMetrics:
    """Gauges of the backlog per topic, refreshed by outbox.relay.backlog."""

    buried: Gauge
    pending: Gauge
    oldest: Gauge
    blocked: Gauge
    oldest_blocked: Gauge
    snapshot_age: Gauge
    snapshot_transactions: Gauge
    dead_rows: Gauge
    storage_bytes: Gauge

    @classmethod
    def of(cls, registry: CollectorRegistry | None) -> BacklogMetrics:
        """The gauges registered in ``registry`` (default: the global one), made once."""
        return _once(cls, registry)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.buried = Gauge(
            "outbox_buried_messages",
            "Buried messages waiting for an operator (outbox buried list).",
            ["topic"],
            registry=registry,
        )
        self.pending = Gauge(
            "outbox_pending_messages",
            "Messages not yet delivered or buried: due, leased or waiting to retry.",
            ["topic"],
            registry=registry,
        )
        self.oldest = Gauge(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest pending message; 0 when there is none.",
            ["topic"],
            registry=registry,
        )
        self.blocked = Gauge(
            "outbox_blocked_keys",
            "Keys whose messages wait behind a buried or failing first message "
            "(outbox keys blocked).",
            ["topic"],
            registry=registry,
        )
        self.oldest_blocked = Gauge(
            "outbox_oldest_blocked_key_age_seconds",
            "How long the longest blocked key has waited; 0 when none is.",
            ["topic"],
            registry=registry,
        )
        # The storage, with no label at all: which session holds a snapshot is
        # the runbook's query, never a label value.
        self.snapshot_age = Gauge(
            "outbox_oldest_snapshot_age_seconds",
            "Age of the oldest snapshot keeping the database from vacuuming what the "
            "outbox deleted (sessions and prepared transactions the relay's role can see).",
            registry=registry,
        )
        self.snapshot_transactions = Gauge(
            "outbox_oldest_snapshot_transactions",
            "Transactions since the oldest snapshot any holder keeps, replication slots "
            "and standbys' feedback included.",
            registry=registry,
        )
        self.dead_rows = Gauge(
            "outbox_dead_rows",
            "Dead row versions in the outbox's tables, as PostgreSQL's statistics last counted.",
            registry=registry,
        )
        self.storage_bytes = Gauge(
            "outbox_storage_bytes",
            "Size of the outbox's tables with their indexes and TOAST.",
            registry=registry,
        )
