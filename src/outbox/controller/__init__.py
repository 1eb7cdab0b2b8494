"""The OutboxTopic controller: `kubectl edit outboxtopic` -> the topic registry relays read.

Run with ``outbox controller``. It watches OutboxTopic resources in its own
namespace (POD_NAMESPACE) or, with --all-namespaces, everywhere; writes each
topic's entry to the registry in PostgreSQL; and keeps each resource's status
(conditions, observedGeneration, backlog) current. kopf peering makes sure
that of several replicas only one acts.
"""

from __future__ import annotations

from outbox.controller.handlers import ControllerConfig, build_registry, operator_settings, run

__all__ = ["ControllerConfig", "build_registry", "operator_settings", "run"]
