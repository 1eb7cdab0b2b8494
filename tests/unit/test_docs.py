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
