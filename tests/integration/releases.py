"""An earlier release's src/, exported from this checkout's git history, for the
relays of a mixed-version fleet (started with it first on PYTHONPATH)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.integration.process import REPO


def export_release(commit: str, into: Path, lacks: str) -> Path:
    """``commit``'s src/ under ``into``; checked to be the release that has no
    module ``lacks`` (what a relay started with it imports). Returns its src/."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, f"git archive {commit}: {archive.stderr.decode()[-300:]}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    probe = subprocess.run(
        [sys.executable, "-c", f"import {lacks}"],
        env={**os.environ, "PYTHONPATH": str(into / "src")},
        capture_output=True,
        check=False,
    )
    assert f"No module named '{lacks}'".encode() in probe.stderr, probe.stderr
    return into / "src"
