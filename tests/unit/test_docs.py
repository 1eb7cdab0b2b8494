"""The reference pages are generated from the code; they must not drift."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "docs" / "reference" / "settings.md"


def test_the_settings_page_matches_the_settings_models() -> None:
    block = re.search(
        r"<!-- settings:start -->\n(.*?)<!-- settings:end -->", SETTINGS.read_text(), re.S
    )
    assert block is not None, "docs/reference/settings.md lacks the settings block"

    generated = subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", "env", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    assert block[1] == generated, "settings drifted: run `python -m tools.reference`"


def test_every_reference_page_is_what_the_code_generates() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "tools.reference", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_the_documented_grants_are_what_migrate_prints() -> None:
    doc = (ROOT / "docs" / "postgres" / "production.md").read_text()
    block = re.search(r"<!-- grants:start -->\n```sql\n(.*?)```\n<!-- grants:end -->", doc, re.S)
    assert block is not None, "docs/postgres/production.md lacks the grants block"
    printed = subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", "migrate", "--grants",
         "relay=outbox_relay", "producer=app", "controller=outbox_controller",
         "operator=outbox_operator", "console=outbox_console", "--schema", "outbox"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert block[1].strip() == printed.strip(), "paste `outbox migrate --grants ...` into it"
