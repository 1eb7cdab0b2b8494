"""The runbooks' commands: every `outbox` command parses, every kubectl command is
namespaced and reads the logs of every relay, not one of them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from outbox.service.cli.commands import _parser

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "operators" / "runbooks.md"
FILLERS = {
    "<id>": "01a22b06-a96f-716b-930b-cea417edbbcf",
    "<topic>": "mail.login_link",
    "<name>": "mail-login-link",
}


def commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", RUNBOOKS.read_text(), re.S)
    found = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                for filler, value in FILLERS.items():
                    line = line.replace(filler, value)
                found.append(line)
    return found


def test_there_are_runbook_commands() -> None:
    assert len(commands()) > 30


@pytest.mark.parametrize("line", [c for c in commands() if "outbox " in c and "exec" in c])
def test_every_outbox_command_parses(line: str) -> None:
    args = shlex.split(line.split(" -- ", 1)[1])
    assert args[0] == "outbox"

    _parser().parse_args(args[1:])  # exits (fails the test) on a usage error


@pytest.mark.parametrize("line", [c for c in commands() if c.startswith("kubectl")])
def test_every_kubectl_command_is_namespaced_and_logs_read_every_pod(line: str) -> None:
    assert "-n $NS" in line, line
    if " logs " in line:
        assert '-l "$RELAYS"' in line or '-l "$CONTROLLER"' in line, line
        assert "--prefix" in line, line
