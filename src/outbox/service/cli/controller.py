"""`outbox controller`: the OutboxTopic operator, with its /metrics."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

import anyio

from outbox.errors import ConfigError
from outbox.handlers import HandlerKinds
from outbox.service.cli.common import (
    DATABASE,
    LOGS,
    service_settings,
    settings_help,
)
from outbox.service.settings import (
    ControllerSettings,
    RelaySettings,
    ServiceSettings,
    kind_settings,
    load,
    relay_config,
)


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    controller = commands.add_parser(
        "controller",
        help="run the OutboxTopic controller (Kubernetes)",
        description=textwrap.fill(
            "Watch OutboxTopic resources and write the topic registry relays read; keep each "
            "resource's status current. Watches POD_NAMESPACE unless --all-namespaces.",
            78,
        ),
        epilog=settings_help(
            ServiceSettings,
            RelaySettings,
            ControllerSettings,
            only=(
                *DATABASE,
                *LOGS,
                "OUTBOX_LEASE",
                "OUTBOX_CONTROLLER_STATUS_INTERVAL",
                "OUTBOX_CONTROLLER_PEERING",
                "OUTBOX_CONTROLLER_PRIORITY",
                "OUTBOX_CONTROLLER_METRICS_PORT",
            ),
        ),
        formatter_class=formatter,
    )
    controller.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (cluster-wide)"
    )
    controller.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica only"
    )
    controller.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from outbox.controller import ControllerConfig, run
    from outbox.controller.grants import parse_grants
    from outbox.service.http import ProbeServer
    from outbox.service.process import database

    settings = service_settings()
    lease = relay_config().lease
    own = load(ControllerSettings)
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not args.all_namespaces and not namespace:
        raise ConfigError(
            "POD_NAMESPACE", "unset; set it (the downward API) or pass --all-namespaces"
        )

    try:
        grants = parse_grants(own.grants)
    except ValueError as exc:
        raise ConfigError("OUTBOX_CONTROLLER_GRANTS", str(exc)) from None

    async def main() -> None:
        async with database(settings) as url:
            config = ControllerConfig(
                conninfo=url,
                lease=lease,
                status_interval=own.status_interval.total_seconds(),
                grants=grants,
                kinds=HandlerKinds(**kind_settings()).mapping,
            )
            async with anyio.create_task_group() as tg:
                # /metrics for Prometheus: its `up` is what OutboxControllerAbsent reads.
                probes = ProbeServer("0.0.0.0", own.metrics_port, alive=lambda: True, ready=_always)
                await tg.start(probes.serve)
                await run(
                    config,
                    namespaces=[namespace],
                    clusterwide=args.all_namespaces,
                    peering=None if args.standalone else own.peering,
                    health_port=own.health_port,
                    priority=own.priority,
                )
                tg.cancel_scope.cancel()

    anyio.run(main)
    return 0


async def _always() -> bool:
    return True
