"""Every handler kind is one unit: its record says everything the rest iterates.

The relay process, the CLI, secret redaction, the controller and the docs read
``outbox.handlers.KINDS``; these checks keep each record whole: its secrets
are exactly its settings' secret fields and every one of them is redacted
from logs, its OutboxTopic field is in the CRD with `kubectl explain` text
for each name, and the CLI's missing-extra message knows its extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from outbox.handler import Kind
from outbox.handlers import KINDS
from outbox.service import logs
from outbox.service.cli import EXTRAS
from outbox.service.cli.common import hide_secrets
from outbox.service.settings import ServiceSettings, kind_settings, variables

CRD = Path(__file__).resolve().parents[2] / "k8s" / "crds" / "outboxtopics.outbox.dev.yaml"
SPEC = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]

BY_NAME = {kind.name: kind for kind in KINDS}


def secret_fields(model: type[Any]) -> set[str]:
    return {
        name
        for name, field in model.model_fields.items()
        if SecretStr in (field.annotation, *getattr(field.annotation, "__args__", ()))
    }


def test_kinds_have_distinct_names_and_fields() -> None:
    assert len(BY_NAME) == len(KINDS)
    fields = [k.spec_field for k in KINDS if k.spec_field]
    assert len(set(fields)) == len(fields)
    assert {"log", "webhook", "nats"} <= set(BY_NAME)


def test_the_cores_reserved_headers_are_the_relays_own_and_the_union_of_the_kinds() -> None:
    from outbox.headers import RESERVED, reserved

    union = {name for kind in KINDS for name in kind.reserved_headers}
    assert set(RESERVED) == {"outbox-"} | union
    assert len(RESERVED) == len(set(RESERVED))
    for kind in KINDS:
        for name in kind.reserved_headers:
            assert name == name.lower()
            assert reserved(name if not name.endswith("-") else f"{name}Thing".upper())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_kinds_secrets_are_its_settings_secret_fields(kind: Kind) -> None:
    if kind.settings is None:
        assert kind.secrets == ()
    else:
        assert set(kind.secrets) == secret_fields(kind.settings)


@pytest.mark.parametrize("kind", [k for k in KINDS if k.secrets], ids=lambda k: k.name)
def test_every_secret_of_a_kind_is_redacted_from_logs(
    kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kind.settings is not None
    prefix = kind.settings.model_config["env_prefix"]
    values = {name: f"s3cr3t-{kind.name}-{name}-value" for name in kind.secrets}
    for name, value in values.items():
        monkeypatch.setenv(f"{prefix}{name}".upper(), value)

    hide_secrets(ServiceSettings())

    for value in values.values():
        assert logs.redact(f"connecting with {value} now") == "connecting with *** now"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.spec_field], ids=lambda k: k.name)
def test_a_kinds_topic_field_is_in_the_crd_with_explain_text(kind: Kind) -> None:
    assert kind.spec_field is not None
    assert kind.config is not None
    field = SPEC["properties"][kind.spec_field]
    assert field.get("description"), f"spec.{kind.spec_field} has no kubectl explain text"
    properties = field["properties"]
    assert set(properties) == set(kind.spec_names), "the CRD and the kind name different fields"
    for camel in kind.spec_names:
        assert properties[camel].get("description"), f"spec.{kind.spec_field}.{camel}"
    # Every name maps to a field of the kind's config, and every config field has a
    # name, in spec.<field> or at the top of the spec (spec.cloudEvents).
    assert set(kind.spec_names.values()) | set(kind.topic_fields.values()) == set(
        kind.config.model_fields
    )
    for camel in kind.topic_fields:
        assert SPEC["properties"][camel].get("description"), f"spec.{camel}"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.extra], ids=lambda k: k.name)
def test_the_cli_names_a_kinds_extra_when_its_module_is_missing(kind: Kind) -> None:
    assert kind.modules, f"the {kind.name} kind's extra brings no module?"
    for module in kind.modules:
        assert EXTRAS.get(module) == kind.extra


def test_outbox_env_lists_every_kinds_settings() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", "env"],
        capture_output=True,
        text=True,
        check=True,
    )
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    names = {name for name, _, _ in variables(*(k.settings for k in KINDS if k.settings))}
    assert names
    assert names <= listed


def test_kind_settings_loads_each_kind_with_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_WEBHOOK_ALLOW", "https://example.com/")
    loaded = kind_settings()
    assert set(loaded) == {k.name for k in KINDS if k.settings}
    assert loaded["webhook"].prefixes() == ["https://example.com/"]


def test_no_kind_is_named_outside_its_unit() -> None:
    """The modules that used to list kinds by hand iterate KINDS now."""
    src = Path(__file__).resolve().parents[2] / "src" / "outbox"
    for rel in (
        "service/process.py",
        "service/cli/relay.py",
        "service/cli/env.py",
        "service/cli/topics.py",
        "service/cli/controller.py",
        "service/cli/common.py",
        "controller/reconcile.py",
    ):
        text = (src / rel).read_text()
        for name in ("NatsSettings", "WebhookSettings", '"webhook"', '"nats"'):
            assert name not in text, f"{rel} names {name}"
