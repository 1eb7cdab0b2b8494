"""Render the chart with the real Helm SDK; write k8s/ from it (`make manifests`).

k8s/ holds plain manifests for users without Helm. They are the chart
rendered with PLAIN_VALUES, so the two cannot drift: tests/chart checks that
k8s/ is exactly what this module writes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "chart" / "outbox-relay"
K8S = ROOT / "k8s"

PLAIN_RELEASE, PLAIN_NAMESPACE = "outbox-relay", "outbox"
PLAIN_VALUES: dict[str, Any] = {
    "monitoring": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
}

# k8s/ file -> the chart templates it is made of.
PLAIN_FILES = {
    "rbac.yaml": ["serviceaccounts.yaml", "rbac.yaml"],
    "deployments.yaml": [
        "relay-deployment.yaml",
        "controller-deployment.yaml",
        "service.yaml",
        "poddisruptionbudget.yaml",
        "migrate-job.yaml",
    ],
    "topics.yaml": ["outboxtopics.yaml"],
    "prometheusrule.yaml": ["prometheusrule.yaml"],
    "dashboard.yaml": ["dashboard.yaml"],
}
HEADER = "# Generated from chart/outbox-relay by `make manifests`; edit the chart, not this file.\n"


def render(
    values: dict[str, Any] | None = None, *, name: str = "outbox", namespace: str = "prod"
) -> dict[str, str]:
    """{template file name: rendered text} for ``values``."""
    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(values or {}, name=name, namespace=namespace)
    return {Path(path).name: text for path, text in out.items()}


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every manifest in ``rendered`` (NOTES.txt aside), parsed."""
    docs: list[dict[str, Any]] = []
    for file, text in sorted(rendered.items()):
        if file.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def plain_manifests() -> dict[str, str]:
    """The files of k8s/ that come from the chart, as they should read."""
    rendered = render(PLAIN_VALUES, name=PLAIN_RELEASE, namespace=PLAIN_NAMESPACE)
    files = {}
    for target, templates in PLAIN_FILES.items():
        parts = [rendered[t].strip() for t in templates if rendered.get(t, "").strip()]
        body = "\n---\n".join(p.removeprefix("---").strip() for p in parts)
        files[target] = HEADER + body + "\n"
    return files


def main() -> int:
    for name, text in plain_manifests().items():
        (K8S / name).write_text(text)
        print(f"wrote k8s/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
