"""`outbox env`: every OUTBOX_* setting, its default and meaning."""

from __future__ import annotations

import argparse
from typing import Any

from outbox.service.settings import (
    KIND_SETTINGS,
    ControllerSettings,
    RelaySettings,
    ServiceSettings,
    SmtpSettings,
    UiSettings,
    variables,
)


def add(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the command to ``commands``."""
    env = commands.add_parser(
        "env",
        help="list every OUTBOX_* variable with its default",
        description="List every OUTBOX_* setting, its default and what it does.",
    )
    env.add_argument("--markdown", action="store_true", help="as a Markdown table")
    env.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = variables(
        ServiceSettings,
        RelaySettings,
        SmtpSettings,
        *KIND_SETTINGS,
        ControllerSettings,
        UiSettings,
    )
    if args.markdown:
        print("| variable | default | meaning |\n| --- | --- | --- |")
        for name, default, description in rows:
            print(f"| `{name}` | `{default}` | {description} |")
    else:
        width = max(len(r[0]) for r in rows)
        for name, default, description in rows:
            print(f"{name:<{width}}  {default:<10}  {description}")
    return 0
