"""What a missing extra says (test_extras installs each one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.process import REPO, run_outbox


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
