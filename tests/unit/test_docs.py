"""The README's settings table is generated from the settings models; it must not drift."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_table_matches_the_settings_models() -> None:
    block = re.search(
        r"<!-- settings:start -->\n(.*?)<!-- settings:end -->", README.read_text(), re.S
    )
    assert block is not None, "README lacks the settings block"

    generated = subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", "env", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    assert block[1] == generated, "README settings drifted: paste `outbox env --markdown` into it"


def test_the_documented_grants_are_what_migrate_prints() -> None:
    doc = (README.parent / "docs" / "postgres.md").read_text()
    block = re.search(r"<!-- grants:start -->\n```sql\n(.*?)```\n<!-- grants:end -->", doc, re.S)
    assert block is not None, "docs/postgres.md lacks the grants block"
    printed = subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", "migrate", "--grants",
         "relay=outbox_relay", "producer=app", "controller=outbox_controller",
         "operator=outbox_operator", "--schema", "outbox"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert block[1].strip() == printed.strip(), "paste `outbox migrate --grants ...` into it"
