"""The Dockerfile and skaffold.yaml, checked with real tools and by structure.

No image is built here (no Docker engine): hadolint reads the Dockerfile,
dockerfile-parse its instructions; skaffold has no offline schema, so its
file is checked for what the dev loop relies on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]


def test_hadolint_is_clean_at_warning_level() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"

    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "warning", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_image_is_slim_pinned_non_root_and_runs_outbox() -> None:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    stages = [i["value"] for i in parser.structure if i["instruction"] == "FROM"]
    final = parser.structure[
        max(i for i, x in enumerate(parser.structure) if x["instruction"] == "FROM") :
    ]

    assert len(stages) == 2, "a build stage and a final stage"
    for base in stages:
        image = base.split()[0]
        assert ":" in image, image
        assert "latest" not in image, image
        assert "-slim" in image, image
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    user = users[-1].split(":")[0]
    assert user.isdigit(), "a numeric user"
    assert user != "0"
    runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    assert "--no-cache-dir" in runs
    assert "rm -f /tmp/*.whl" in runs
    assert "apt-get" not in runs, "no build tools in the final image"
    assert "gcc" not in runs, "no build tools in the final image"
    extras = runs.split(".whl)[", 1)[1].split("]", 1)[0].split(",")
    assert "embedded" not in extras, "the image leaves the 41 MB embedded PostgreSQL out"
    assert {"relay", "mail", "webhook", "nats", "k8s", "binary"} <= set(extras)
    copies = [i["value"] for i in final if i["instruction"] == "COPY"]
    assert copies == ["--from=build /dist/*.whl /tmp/", "constraints.txt /tmp/"], (
        "the final image gets the wheel and its pins only"
    )
    assert parser.baseimage.startswith("python:3.12")
    entry = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert entry == ['["outbox"]']


def test_dockerignore_keeps_the_context_small() -> None:
    text = (ROOT / ".dockerignore").read_text().splitlines()
    lines = [line.strip() for line in text if line.strip() and not line.startswith("#")]

    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(lines)


def test_skaffold_builds_the_image_and_deploys_the_chart_for_dev() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())

    assert config["apiVersion"].startswith("skaffold/v4beta")
    assert config["kind"] == "Config"
    [artifact] = config["build"]["artifacts"]
    assert (ROOT / artifact.get("context", ".") / artifact["docker"]["dockerfile"]).is_file()
    [release] = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
    for values in release["valuesFiles"]:
        dev = yaml.safe_load((ROOT / values).read_text())
        assert dev["dev"]["enabled"] is True
    image = artifact["image"].replace("-", "_")
    assert release["setValueTemplates"]["image.repository"] == f"{{{{.IMAGE_REPO_{image}}}}}"
    forwarded = {(p["resourceName"], p["port"]) for p in config["portForward"]}
    assert (f"{release['name']}-outbox-relay-metrics", 9090) in forwarded


def test_the_image_installs_every_dependency_at_a_pinned_version() -> None:
    import re
    from importlib.metadata import requires

    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not pinned with =="
            pinned[re.sub(r"[-_.]+", "-", name).lower()] = version
    extras = {"relay", "mail", "webhook", "nats", "k8s", "binary"}
    wanted = set()
    for req in requires("outbox-relay") or []:
        name = re.split(r"[\s\[<>=!;~]", req, maxsplit=1)[0]
        marker = req.partition(";")[2]
        extra = re.search(r"extra == [\"']([^\"']+)[\"']", marker)
        if name != "outbox-relay" and (extra is None or extra[1] in extras):
            wanted.add(re.sub(r"[-_.]+", "-", name).lower())
    run = next(
        i["value"]
        for i in DockerfileParser(path=str(ROOT / "Dockerfile")).structure
        if i["instruction"] == "RUN" and "pip install" in i["value"] and ".whl" in i["value"]
    )

    assert wanted <= pinned.keys(), f"not pinned: {sorted(wanted - pinned.keys())}"
    assert "-c /tmp/constraints.txt" in run
    assert "constraints.txt" in (ROOT / ".dockerignore").read_text()


def test_a_digest_pins_the_image_over_its_tag() -> None:
    from tools.manifests import documents, render

    digest = "sha256:" + "a" * 64
    docs = documents(render({"image": {"digest": digest, "tag": "moved"}}))
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    }

    assert images == {f"ghcr.io/outbox-relay/outbox-relay@{digest}"}
