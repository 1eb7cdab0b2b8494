"""The kopf operator: OutboxTopic resources -> the topic registry, and back to .status.

kopf is imported here and nowhere else; the decorated functions only adapt
kopf's arguments and call outbox.controller.reconcile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import secrets
from typing import Any

import kopf
from prometheus_client import Counter

from outbox.clock import Clock, system_clock
from outbox.controller.grants import Grants
from outbox.controller.reconcile import (
    backlog,
    forget,
    prune,
    reconcile,
    source_of,
    unavailable,
)
from outbox.errors import StoreError, StoreUnavailable, first_line
from outbox.handler import HandlerKind
from outbox.handlers import HandlerKinds
from outbox.handlers.mail.topics import TOPICS
from outbox.postgres import PostgresStore, connect_pool

__all__ = ["GROUP", "PLURAL", "VERSION", "ControllerConfig", "build_registry"]

GROUP, VERSION, PLURAL = "outbox.dev", "v1alpha1", "outboxtopics"
BUILTIN_TOPICS = TOPICS

log = logging.getLogger("outbox.controller")

RECONCILES = Counter(
    "outbox_controller_reconciles",
    "OutboxTopic reconciles by outcome: applied, invalid, conflict, unavailable.",
    ["outcome"],
)
for _outcome in ("applied", "invalid", "conflict", "unavailable"):
    RECONCILES.labels(_outcome)


@dataclasses.dataclass
class ControllerConfig:
    """What the handlers need: the database, the relays' lease, the status period."""

    conninfo: str
    lease: dt.timedelta
    status_interval: float = 30.0
    clock: Clock = system_clock
    kinds: dict[str, HandlerKind] = dataclasses.field(
        default_factory=lambda: HandlerKinds().mapping
    )
    builtin_topics: frozenset[str] = BUILTIN_TOPICS
    store: PostgresStore | None = None
    namespaces: list[str] | None = None
    """The namespaces watched (None: every one): only their entries are pruned."""
    grants: Grants = dataclasses.field(default_factory=Grants)
    """Which namespaces may govern which topics (OUTBOX_CONTROLLER_GRANTS)."""


def build_registry(config: ControllerConfig) -> kopf.OperatorRegistry:
    """A kopf registry with the OutboxTopic handlers bound to ``config``."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.startup(registry=registry)
    async def open_pool(settings: kopf.OperatorSettings, **_: Any) -> None:
        # A short wait for a connection: during an outage each reconcile says
        # so (Ready Unknown) within seconds instead of hanging for the default 30 s.
        pool = connect_pool(config.conninfo, min_size=1, max_size=2, timeout=5)
        await pool.open(wait=True, timeout=30)
        config.store = PostgresStore(pool)

    @kopf.on.cleanup(registry=registry)
    async def close_pool(**_: Any) -> None:
        if config.store is not None:
            closing = config.store
            config.store = None  # ticks racing the shutdown skip, rather than report an outage
            await closing.pool.close()

    warned: dict[str, tuple[str, str]] = {}
    """The problem last reported as a Warning, by resource: one Warning per change."""

    def store() -> PostgresStore:
        assert config.store is not None, "the startup handler opens the pool"
        return config.store

    async def apply(
        body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, *, stats: bool
    ) -> None:
        if config.store is None:
            return  # shutting down
        previous = dict(body.get("status") or {})
        now = config.clock()
        try:
            outcome = await reconcile(
                store(),
                dict(spec),
                source=source_of(meta.namespace, meta.name or ""),
                generation=meta.get("generation"),
                now=now,
                lease=config.lease,
                builtin_topics=config.builtin_topics,
                kinds=config.kinds,
                created=_created(meta),
                previous=previous,
                grants=config.grants,
            )
            status = dict(outcome.status)
            if stats and outcome.ready:
                # Each OutboxTopic's timer reads the fleet's last count, not a count of its own.
                every = dt.timedelta(seconds=config.status_interval)
                status.update(await backlog(store(), status["topic"], config.clock(), every))
        except (StoreUnavailable, StoreError) as exc:
            reason = first_line(exc, typed=False)
            outcome = unavailable(reason.removeprefix("outbox: "), now, previous)
            status = dict(outcome.status)
        for key, value in status.items():
            patch.status[key] = value
        RECONCILES.labels(_outcome_of(status)).inc()
        if outcome.event:
            log.info("%s/%s: %s", meta.namespace, meta.name, outcome.event)
            kopf.info(body, reason="Applied", message=outcome.event)
        key = source_of(meta.namespace, meta.name or "")
        if outcome.ready:
            warned.pop(key, None)
        elif outcome.warning or key not in warned:
            # The status kopf hands a handler can predate the last patch (a
            # timer racing an update): what was warned is remembered here too.
            ready = status["conditions"][0]
            problem = (ready["reason"], ready["message"])
            if warned.get(key) != problem:
                warned[key] = problem
                log.warning("%s/%s: %s", meta.namespace, meta.name, problem[1])
                kopf.warn(body, reason=problem[0], message=problem[1])

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry, field="spec")
    @kopf.on.resume(*resource, registry=registry)
    async def changed(
        body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, **_: Any
    ) -> None:
        await apply(body, spec, meta, patch, stats=True)

    @kopf.index(*resource, registry=registry, id="governing")
    def governing(namespace: str | None, name: str | None, **_: Any) -> dict[str, None]:
        return {source_of(namespace, name or ""): None}

    @kopf.timer(*resource, registry=registry, interval=config.status_interval, initial_delay=1)
    async def refresh(
        body: kopf.Body,
        spec: kopf.Spec,
        meta: kopf.Meta,
        patch: kopf.Patch,
        **kwargs: Any,
    ) -> None:
        # Level-based: also takes over a topic whose former holder was deleted.
        await apply(body, spec, meta, patch, stats=True)
        # kopf fills indexes before any handler runs, so this is every resource.
        if config.store is None:
            return
        try:
            existing: kopf.Index[str, None] = kwargs["governing"]
            gone = await prune(store(), set(existing), namespaces=config.namespaces)
        except (StoreUnavailable, StoreError):
            return  # apply() has said so in the status
        if gone:
            log.info("removed registry entries of deleted OutboxTopics: %s", gone)

    # No finalizer (optional): deleting an OutboxTopic never waits for this
    # controller, so `helm uninstall` (which removes the controller too) leaves
    # nothing stuck Terminating. Deleted while no controller ran, a resource's
    # entry is pruned by the next status tick of any other resource.
    @kopf.on.delete(*resource, registry=registry, optional=True)
    async def deleted(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
        if config.store is None:
            return  # shutting down: the next controller prunes the entry
        gone = await forget(store(), source_of(meta.namespace, meta.name or ""))
        if gone:
            log.info("%s/%s: removed registry entries %s", meta.namespace, meta.name, gone)

    _without_finalizers(registry)
    return registry


def _without_finalizers(registry: kopf.OperatorRegistry) -> None:
    """Let the status timers run without a finalizer on each OutboxTopic.

    kopf adds a finalizer to every resource that has a timer, so that it can
    stop the timer before the resource goes; that would leave OutboxTopics
    Terminating whenever no controller runs (`helm uninstall` removes the
    controller with them). A timer needs no such guarantee here: kopf stops it
    when the resource is deleted, and a tick that races the deletion only
    rewrites a status nobody reads. kopf's public API has no switch for this,
    so the registered handlers are copied with the flag off; the test of
    deletion without a controller fails if kopf changes how it keeps them.
    """
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers
    ]


def _outcome_of(status: dict[str, Any]) -> str:
    ready = status["conditions"][0]
    if ready["status"] == "True":
        return "applied"
    if ready["status"] == "Unknown":
        return "unavailable"
    return "conflict" if ready["reason"] == "Conflict" else "invalid"


def _created(meta: kopf.Meta) -> dt.datetime | None:
    stamp = meta.get("creationTimestamp")
    if not stamp:
        return None
    return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def operator_settings(*, events: bool = True) -> kopf.OperatorSettings:
    """kopf settings: progress in our own annotations, events when asked for."""
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="outbox.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="outbox.dev")
    settings.posting.enabled = events
    settings.posting.level = logging.INFO
    settings.scanning.disabled = True
    return settings


async def run(
    config: ControllerConfig,
    *,
    namespaces: list[str],
    clusterwide: bool,
    peering: str | None,
    health_port: int | None = None,
    stop_flag: Any = None,
    priority: int = 0,
) -> None:
    """Run the operator until stopped (SIGTERM/SIGINT, or ``stop_flag``).

    Peers sharing ``peering`` pause all but the highest priority; equal
    priorities pause every one of them, so 0 picks a random one.
    """
    config.namespaces = None if clusterwide else list(namespaces)
    if peering is not None and priority == 0:
        priority = 1 + secrets.randbelow(2**31 - 2)
        log.info("peering %s with priority %d", peering, priority)
    await kopf.operator(
        registry=build_registry(config),
        settings=operator_settings(),
        clusterwide=clusterwide,
        namespaces=[] if clusterwide else namespaces,
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        stop_flag=stop_flag,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
    )
